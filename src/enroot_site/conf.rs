//! `enroot.conf` and `enroot.conf.d/*.conf`: `NAME VALUE` (or `NAME=VALUE`)
//! lines, of which enroot takes the names `ENROOT_*`, `MELLANOX_*`,
//! `NVIDIA_*`, `SSL_CERT_DIR`, `SSL_CERT_FILE` and the proxy variables; a
//! later file wins. berth takes the defaults pyxis users see
//! ([`Defaults`]) and, for its pulls, the proxies and `SSL_CERT_FILE`
//! ([`network_settings`]); every other name set is listed as not used. All of them
//! are kept as `NAME=VALUE` for the site's hooks, which enroot runs with
//! its settings in their environment.

/// The container defaults of a site's enroot configuration; `None`: not set
/// there (berth's own default applies). An option on the job wins.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defaults {
    /// `ENROOT_MOUNT_HOME`: `--container-mount-home`.
    pub mount_home: Option<bool>,
    /// `ENROOT_REMAP_ROOT`: `--container-remap-root`.
    pub remap_root: Option<bool>,
    /// `ENROOT_ROOTFS_WRITABLE`: `--container-writable` (or `--container-readonly`).
    pub rootfs_writable: Option<bool>,
}

/// What the configuration files set.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Read {
    /// The container defaults.
    pub defaults: Defaults,
    /// The names set that berth does not use itself (once each).
    pub unused: Vec<String>,
    /// Every name set, as `NAME=VALUE` (a later line replaces an earlier
    /// one), for the site's hooks.
    pub settings: Vec<String>,
    /// Values berth cannot take as written.
    pub notes: Vec<String>,
}

/// Reads one configuration file's `text` into `read`.
pub fn parse(text: &str, read: &mut Read) {
    let Read {
        defaults,
        unused,
        settings,
        notes,
    } = read;
    for line in text.lines() {
        let line = line.trim_start_matches([' ', '\t']);
        let end = line.find([' ', '\t', '=']).unwrap_or(line.len());
        let (name, rest) = line.split_at(end);
        if !is_enroot_name(name) {
            continue;
        }
        let value = unquote(rest.trim_start_matches([' ', '\t', '=']).trim_end());
        settings.retain(|s| s.split_once('=').is_none_or(|(n, _)| n != name));
        settings.push(format!("{name}={value}"));
        if value.contains(['$', '`']) {
            notes.push(format!(
                "{name}: berth does not evaluate shell text ({value})"
            ));
        }
        if NETWORK_NAMES.contains(&name) {
            // Taken by berth's configuration for its pulls
            // ([`network_settings`]).
            continue;
        }
        let slot = match name {
            "ENROOT_MOUNT_HOME" => &mut defaults.mount_home,
            "ENROOT_REMAP_ROOT" => &mut defaults.remap_root,
            "ENROOT_ROOTFS_WRITABLE" => &mut defaults.rootfs_writable,
            _ => {
                if !unused.iter().any(|n| n == name) {
                    unused.push(name.to_string());
                }
                continue;
            }
        };
        *slot = Some(enroot_true(value));
    }
}

/// The names of enroot's configuration that berth's pulls take, where
/// berth's own configuration and slurmd's environment leave them unset:
/// the proxies and the CA bundle (enroot passes them to curl).
pub const NETWORK_NAMES: [&str; 5] = [
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
];

/// The network settings of `read` (`NAME`, `VALUE`), those of
/// [`NETWORK_NAMES`] set to a value that is not empty.
pub fn network_settings(read: &Read) -> Vec<(&str, &str)> {
    read.settings
        .iter()
        .filter_map(|s| s.split_once('='))
        .filter(|(name, value)| NETWORK_NAMES.contains(name) && !value.is_empty())
        .collect()
}

/// The names enroot takes from its configuration files.
fn is_enroot_name(name: &str) -> bool {
    let upper_tail =
        |tail: &str| !tail.is_empty() && tail.chars().all(|c| c.is_ascii_uppercase() || c == '_');
    name.strip_prefix("ENROOT_").is_some_and(upper_tail)
        || name.starts_with("MELLANOX_")
        || name.starts_with("NVIDIA_")
        || matches!(
            name,
            "SSL_CERT_DIR"
                | "SSL_CERT_FILE"
                | "all_proxy"
                | "no_proxy"
                | "http_proxy"
                | "https_proxy"
        )
}

/// Whether enroot counts `value` as set: everything but the empty text and
/// `n`, `no`, `N`, `No`, `NO`, `f`, `false`, `F`, `False`, `FALSE`.
fn enroot_true(value: &str) -> bool {
    !matches!(
        value,
        "" | "n" | "no" | "N" | "No" | "NO" | "f" | "false" | "F" | "False" | "FALSE"
    )
}

/// `value` without one pair of surrounding quotes.
fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if let Some(inner) = value
            .strip_prefix(quote)
            .and_then(|v| v.strip_suffix(quote))
        {
            return inner;
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_defaults_as_enroot_does() {
        let text = "# enroot.conf of a site\n\
                    #ENROOT_REMAP_ROOT yes\n\
                    ENROOT_MOUNT_HOME        yes\n\
                    ENROOT_ROOTFS_WRITABLE=\"no\"\n\
                    ENROOT_SQUASH_OPTIONS    -comp lzo -noD\n\
                    ENROOT_CACHE_PATH ${HOME}/.cache\n\
                    MELLANOX_VISIBLE_DEVICES all\n\
                    OTHER_NAME 1\n";
        let mut read = Read::default();
        parse(text, &mut read);
        let Read {
            defaults,
            unused,
            settings,
            notes,
        } = read;
        assert_eq!(
            defaults,
            Defaults {
                mount_home: Some(true),
                remap_root: None,
                rootfs_writable: Some(false),
            }
        );
        assert_eq!(
            unused,
            [
                "ENROOT_SQUASH_OPTIONS",
                "ENROOT_CACHE_PATH",
                "MELLANOX_VISIBLE_DEVICES"
            ]
        );
        assert_eq!(
            settings,
            [
                "ENROOT_MOUNT_HOME=yes",
                "ENROOT_ROOTFS_WRITABLE=no",
                "ENROOT_SQUASH_OPTIONS=-comp lzo -noD",
                "ENROOT_CACHE_PATH=${HOME}/.cache",
                "MELLANOX_VISIBLE_DEVICES=all"
            ]
        );
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].starts_with("ENROOT_CACHE_PATH"), "{notes:?}");
    }

    #[test]
    fn a_later_file_wins_and_false_is_enroots_false() {
        let mut read = Read::default();
        parse("ENROOT_REMAP_ROOT y\n", &mut read);
        assert_eq!(read.defaults.remap_root, Some(true));
        for off in ["n", "No", "FALSE", "f", "''"] {
            parse(&format!("ENROOT_REMAP_ROOT {off}\n"), &mut read);
            assert_eq!(read.defaults.remap_root, Some(false), "{off}");
        }
        parse("ENROOT_REMAP_ROOT 1\n", &mut read);
        assert_eq!(read.defaults.remap_root, Some(true));
        assert_eq!(read.settings, ["ENROOT_REMAP_ROOT=1"]);
    }

    #[test]
    fn proxies_and_the_ca_file_are_taken_and_not_listed_as_unused() {
        let mut read = Read::default();
        parse(
            "https_proxy proxy.site:3128\nno_proxy \nSSL_CERT_FILE /etc/site.pem\nSSL_CERT_DIR /d\n",
            &mut read,
        );
        assert_eq!(read.unused, ["SSL_CERT_DIR"]);
        assert_eq!(
            network_settings(&read),
            [
                ("https_proxy", "proxy.site:3128"),
                ("SSL_CERT_FILE", "/etc/site.pem")
            ]
        );
    }
}

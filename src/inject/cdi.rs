//! Container Device Interface (CDI) specs: the vendor-neutral description of
//! devices (NVIDIA's `nvidia-ctk cdi generate`, AMD, Intel ship generators).
//!
//! Specs are read from the spec folders (`/etc/cdi`, `/var/run/cdi`), JSON
//! or YAML (the block subset generators write: maps, lists, plain and quoted
//! scalars; no anchors, flow collections or multi-line strings). For the
//! requested devices (`KIND=NAME`, e.g. `nvidia.com/gpu=0`) the spec's
//! container edits are applied: device nodes, mounts (libraries among them
//! are also registered with the loader) and environment. Hooks run nowhere:
//! berth applies what they would do itself (the loader cache) and names the
//! hooks it skipped in the summary.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::Value;

use super::{HostLibrary, Injection};
use crate::container::spec::MountSpec;

/// Default spec folders, lowest precedence first.
pub const DEFAULT_SPEC_DIRS: &[&str] = &["/etc/cdi", "/var/run/cdi"];

/// One CDI spec file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    /// `vendor.com/class`.
    pub kind: String,
    /// The devices it describes.
    #[serde(default)]
    pub devices: Vec<Device>,
    /// Edits for every device of the spec.
    #[serde(default)]
    pub container_edits: Edits,
}

/// One device of a spec.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// The name after `KIND=`.
    pub name: String,
    /// Its own edits.
    #[serde(default)]
    pub container_edits: Edits,
}

/// What a device adds to a container.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    /// `NAME=VALUE` settings.
    #[serde(default)]
    pub env: Vec<String>,
    /// Device nodes.
    #[serde(default)]
    pub device_nodes: Vec<DeviceNode>,
    /// Bind mounts.
    #[serde(default)]
    pub mounts: Vec<Mount>,
    /// OCI hooks (not run; see the module doc).
    #[serde(default)]
    pub hooks: Vec<Value>,
}

/// A device node edit.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    /// Path inside the container.
    pub path: PathBuf,
    /// Path on the host, when different.
    #[serde(default)]
    pub host_path: Option<PathBuf>,
}

/// A mount edit.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    /// Host path.
    pub host_path: PathBuf,
    /// Path inside the container.
    pub container_path: PathBuf,
    /// Mount options (`ro`, `nosuid`, `bind`, ...).
    #[serde(default)]
    pub options: Vec<String>,
}

impl Spec {
    /// Parses a spec from JSON or YAML text.
    pub fn parse(text: &str) -> anyhow::Result<Spec> {
        let value = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).context("invalid JSON")?
        } else {
            yaml_subset(text)?
        };
        serde_json::from_value(value).context("not a CDI spec (needs kind, devices)")
    }
}

/// Every spec in `dirs` (files ending in `.json`, `.yaml` or `.yml`); a later
/// folder's spec of the same kind comes later and wins device name clashes.
pub fn load_specs(dirs: &[PathBuf]) -> anyhow::Result<Vec<Spec>> {
    let mut specs = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("json" | "yaml" | "yml")
                )
            })
            .collect();
        paths.sort();
        for path in paths {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read CDI spec {}", path.display()))?;
            specs.push(
                Spec::parse(&text)
                    .with_context(|| format!("cannot use CDI spec {}", path.display()))?,
            );
        }
    }
    Ok(specs)
}

/// Whether some spec describes devices of `kind`.
pub fn has_kind(specs: &[Spec], kind: &str) -> bool {
    specs.iter().any(|s| s.kind == kind)
}

/// The injection for the fully qualified device names `requested`
/// (`vendor.com/class=name`).
pub fn injection(specs: &[Spec], requested: &[String]) -> anyhow::Result<Injection> {
    let mut injection = Injection::default();
    let mut used_kinds: Vec<&str> = Vec::new();
    for name in requested {
        let Some((kind, device)) = name.split_once('=') else {
            bail!("CDI device '{name}': write KIND=NAME, e.g. nvidia.com/gpu=0");
        };
        let found = specs
            .iter()
            .rev()
            .find_map(|s| (s.kind == kind).then(|| s.devices.iter().find(|d| d.name == device))?);
        let Some(found) = found else {
            let known: Vec<String> = specs
                .iter()
                .filter(|s| s.kind == kind)
                .flat_map(|s| s.devices.iter().map(|d| format!("{kind}={}", d.name)))
                .collect();
            bail!(
                "no CDI device '{name}' in the specs of this node (known: {})",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                }
            );
        };
        add_edits(&mut injection, &found.container_edits);
        if !used_kinds.contains(&kind) {
            used_kinds.push(kind);
            for spec in specs.iter().filter(|s| s.kind == kind) {
                add_edits(&mut injection, &spec.container_edits);
            }
        }
        injection.summary.push(format!("CDI {name}"));
    }
    Ok(injection)
}

fn add_edits(injection: &mut Injection, edits: &Edits) {
    injection.env.extend(edits.env.iter().cloned());
    for node in &edits.device_nodes {
        injection.devices.push(MountSpec {
            source: node.host_path.clone().unwrap_or_else(|| node.path.clone()),
            target: node.path.clone(),
            read_only: false,
        });
    }
    for mount in &edits.mounts {
        let name = file_name(&mount.container_path);
        if name.contains(".so") && mount.host_path.is_file() {
            let real = std::fs::canonicalize(&mount.host_path).unwrap_or(mount.host_path.clone());
            injection.libraries.push(HostLibrary {
                soname: super::profile::soname_of(Path::new(&name)),
                host_path: real,
                abi: None,
                origin: "CDI".to_string(),
            });
        }
        injection.files.push(MountSpec {
            source: mount.host_path.clone(),
            target: mount.container_path.clone(),
            read_only: mount.options.iter().any(|o| o == "ro"),
        });
    }
    if !edits.hooks.is_empty() {
        injection
            .summary
            .push(format!("{} CDI hook(s) not run", edits.hooks.len()));
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// One meaningful line of YAML: its indentation and text.
struct Line {
    indent: usize,
    text: String,
}

/// Parses the block-YAML subset into a JSON value.
pub fn yaml_subset(text: &str) -> anyhow::Result<Value> {
    let mut lines: Vec<Line> = Vec::new();
    for raw in text.lines() {
        let trimmed = raw.trim_end();
        let content = trimmed.trim_start();
        if content.is_empty() || content.starts_with('#') || content == "---" {
            continue;
        }
        if content.starts_with('{') || content.starts_with('[') || content.starts_with('&') {
            bail!("YAML line '{content}': flow collections and anchors are not supported");
        }
        lines.push(Line {
            indent: trimmed.len() - content.len(),
            text: content.to_string(),
        });
    }
    if lines.is_empty() {
        bail!("empty YAML document");
    }
    let mut at = 0;
    let indent = lines[0].indent;
    let value = node(&mut lines, &mut at, indent)?;
    if at != lines.len() {
        bail!("YAML line '{}': unexpected indentation", lines[at].text);
    }
    Ok(value)
}

fn node(lines: &mut [Line], at: &mut usize, indent: usize) -> anyhow::Result<Value> {
    if lines[*at].text.starts_with("- ") || lines[*at].text == "-" {
        let mut items = Vec::new();
        while *at < lines.len() && lines[*at].indent == indent && lines[*at].text.starts_with('-') {
            let rest = lines[*at].text[1..].trim_start().to_string();
            if rest.is_empty() {
                *at += 1;
                let inner = lines.get(*at).map(|l| l.indent).unwrap_or(0);
                if inner <= indent {
                    items.push(Value::Null);
                    continue;
                }
                items.push(node(lines, at, inner)?);
            } else if is_key_line(&rest) {
                // "- key: value": the item is a map starting on this line.
                let offset = lines[*at].text.len() - rest.len();
                lines[*at].indent = indent + offset;
                lines[*at].text = rest;
                let inner = lines[*at].indent;
                items.push(node(lines, at, inner)?);
            } else {
                items.push(scalar(&rest));
                *at += 1;
            }
        }
        return Ok(Value::Array(items));
    }
    let mut map = serde_json::Map::new();
    while *at < lines.len() && lines[*at].indent == indent && !lines[*at].text.starts_with("- ") {
        let text = lines[*at].text.clone();
        let Some((key, value)) = split_key(&text) else {
            bail!("YAML line '{text}': expected 'key: value'");
        };
        *at += 1;
        let value = if value.is_empty() {
            match lines.get(*at) {
                Some(next) if next.indent > indent => {
                    let inner = next.indent;
                    node(lines, at, inner)?
                }
                Some(next) if next.indent == indent && next.text.starts_with('-') => {
                    node(lines, at, indent)?
                }
                _ => Value::Null,
            }
        } else if value.starts_with('{') || value.starts_with('[') {
            bail!("YAML line '{text}': flow collections are not supported (write a block list)");
        } else {
            scalar(value)
        };
        map.insert(unquote(key), value);
    }
    Ok(Value::Object(map))
}

fn is_key_line(text: &str) -> bool {
    !text.starts_with('"') && !text.starts_with('\'') && split_key(text).is_some()
}

fn split_key(text: &str) -> Option<(&str, &str)> {
    if let Some(pos) = text.find(": ") {
        return Some((text[..pos].trim(), text[pos + 2..].trim()));
    }
    text.strip_suffix(':').map(|key| (key.trim(), ""))
}

fn scalar(text: &str) -> Value {
    Value::String(unquote(text.split(" #").next().unwrap_or(text).trim()))
}

fn unquote(text: &str) -> String {
    let t = text.trim();
    for quote in ['"', '\''] {
        if t.len() >= 2 && t.starts_with(quote) && t.ends_with(quote) {
            return t[1..t.len() - 1].to_string();
        }
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape `nvidia-ctk cdi generate` writes.
    const YAML: &str = r#"---
cdiVersion: 0.5.0
containerEdits:
  deviceNodes:
  - path: /dev/nvidiactl
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  hooks:
  - args:
    - nvidia-ctk
    - hook
    hookName: createContainer
    path: /usr/bin/nvidia-ctk
  mounts:
  - containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.535.104.05
    hostPath: /nonexistent/libcuda.so.535.104.05
    options:
    - ro
    - nosuid
devices:
- containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
  name: "0"
- containerEdits:
    deviceNodes:
    - hostPath: /fake/dev/nvidia1
      path: /dev/nvidia1
  name: '1'
kind: nvidia.com/gpu
"#;

    #[test]
    fn yaml_and_json_give_the_same_spec() {
        let yaml = Spec::parse(YAML).unwrap();
        let json_text = serde_json::to_string(&yaml_subset(YAML).unwrap()).unwrap();
        let json = Spec::parse(&json_text).unwrap();
        for spec in [yaml, json] {
            assert_eq!(spec.kind, "nvidia.com/gpu");
            assert_eq!(spec.devices.len(), 2);
            assert_eq!(spec.devices[1].name, "1");
            assert_eq!(spec.container_edits.hooks.len(), 1);
            assert_eq!(spec.container_edits.mounts[0].options, ["ro", "nosuid"]);
        }
    }

    #[test]
    fn applies_device_and_spec_edits() {
        let specs = vec![Spec::parse(YAML).unwrap()];
        let inj = injection(&specs, &["nvidia.com/gpu=1".to_string()]).unwrap();
        let devices: Vec<_> = inj
            .devices
            .iter()
            .map(|d| (d.source.clone(), d.target.clone()))
            .collect();
        assert_eq!(
            devices,
            [
                (
                    PathBuf::from("/fake/dev/nvidia1"),
                    PathBuf::from("/dev/nvidia1")
                ),
                (
                    PathBuf::from("/dev/nvidiactl"),
                    PathBuf::from("/dev/nvidiactl")
                ),
            ]
        );
        assert_eq!(inj.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
        assert!(inj.files[0].read_only);
        assert!(inj
            .summary
            .iter()
            .any(|s| s.contains("1 CDI hook(s) not run")));
        let err = injection(&specs, &["nvidia.com/gpu=7".to_string()]).unwrap_err();
        assert!(
            err.to_string()
                .contains("known: nvidia.com/gpu=0, nvidia.com/gpu=1"),
            "{err}"
        );
        assert!(injection(&specs, &["gpu0".to_string()]).is_err());
    }

    #[test]
    fn rejects_what_the_subset_lacks() {
        assert!(yaml_subset("a: {b: 1}").is_err());
        assert!(yaml_subset("").is_err());
        assert!(Spec::parse("cdiVersion: 0.5.0\n").is_err());
    }
}

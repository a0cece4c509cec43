//! Sizes and times as people write and read them: `50G`, `800M`, `1.2 GiB`,
//! `2026-11-29 20:43`.

use anyhow::{bail, Result};

const UNITS: &[(char, u32)] = &[('K', 1), ('M', 2), ('G', 3), ('T', 4), ('P', 5)];

/// Parses a size: a number of bytes, optionally with a binary unit `K`, `M`,
/// `G`, `T` or `P` (powers of 1024; `KB`, `KiB` and lower case accepted).
/// Fractions are allowed with a unit (`1.5G`).
pub fn parse_size(text: &str) -> Result<u64> {
    let t = text.trim();
    let digits_end = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits_end);
    let unit = unit.trim();
    let unit_core = unit
        .strip_suffix("iB")
        .or_else(|| unit.strip_suffix("ib"))
        .or_else(|| unit.strip_suffix(['B', 'b']))
        .unwrap_or(unit);
    let fail = || {
        anyhow::anyhow!(
            "invalid size '{text}': give bytes or a number with K, M, G, T or P \
             (powers of 1024), e.g. 50G or 800M"
        )
    };
    let power = match unit_core.chars().collect::<Vec<_>>()[..] {
        [] => 0,
        [c] => UNITS
            .iter()
            .find(|(u, _)| *u == c.to_ascii_uppercase())
            .map(|(_, p)| *p)
            .ok_or_else(fail)?,
        _ => return Err(fail()),
    };
    if number.is_empty() {
        return Err(fail());
    }
    let scale = 1024u64.pow(power);
    if let Ok(n) = number.parse::<u64>() {
        return n.checked_mul(scale).ok_or_else(fail);
    }
    let x: f64 = number.parse().map_err(|_| fail())?;
    if power == 0 {
        bail!("invalid size '{text}': a number of bytes must be whole");
    }
    let bytes = x * scale as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(fail());
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit and one decimal: `512 B`, `1.5 KiB`, `3.2 GiB`.
pub fn format_size(bytes: u64) -> String {
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64;
    let mut unit = "B";
    for (u, _) in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = match u {
            'K' => "KiB",
            'M' => "MiB",
            'G' => "GiB",
            'T' => "TiB",
            _ => "PiB",
        };
    }
    format!("{value:.1} {unit}")
}

/// Formats seconds since the epoch as a UTC date and time, `YYYY-MM-DD HH:MM`.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rest / 3600,
        (rest % 3600) / 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Parses an age: a number with a unit `s`, `m`, `h` or `d` (seconds,
/// minutes, hours, days), e.g. `36h` or `7d`; a bare number is seconds.
pub fn parse_age(text: &str) -> Result<std::time::Duration> {
    let t = text.trim();
    let fail = || {
        anyhow::anyhow!(
            "invalid age '{text}': give a number with s, m, h or d (seconds, minutes, \
             hours, days), e.g. 7d or 36h"
        )
    };
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
    let n: u64 = number.parse().map_err(|_| fail())?;
    let seconds = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(fail()),
    };
    Ok(std::time::Duration::from_secs(
        n.checked_mul(seconds).ok_or_else(fail)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages() {
        assert_eq!(parse_age("7d").unwrap().as_secs(), 7 * 86_400);
        assert_eq!(parse_age("36h").unwrap().as_secs(), 36 * 3600);
        assert_eq!(parse_age("90").unwrap().as_secs(), 90);
        assert!(parse_age("7 weeks").is_err());
        assert!(parse_age("d").unwrap_err().to_string().contains("e.g. 7d"));
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(parse_size("123").unwrap(), 123);
        assert_eq!(parse_size("800M").unwrap(), 800 << 20);
        assert_eq!(parse_size("50G").unwrap(), 50 << 30);
        assert_eq!(parse_size("50g").unwrap(), 50 << 30);
        assert_eq!(parse_size("2KiB").unwrap(), 2048);
        assert_eq!(parse_size("2 KB").unwrap(), 2048);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        for bad in ["", "G", "12X", "1.5", "-1G", "1GG", "99999999999999999999P"] {
            let e = parse_size(bad).unwrap_err().to_string();
            assert!(e.contains("size"), "{bad}: {e}");
        }
    }

    #[test]
    fn sizes_format() {
        assert_eq!(format_size(0), "0 B");
        assert_eq!(format_size(1023), "1023 B");
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(800 << 20), "800.0 MiB");
        assert_eq!(format_size(50 << 30), "50.0 GiB");
    }

    #[test]
    fn times_format() {
        assert_eq!(format_utc(0), "1970-01-01 00:00");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00");
        assert_eq!(format_utc(1_795_985_000), "2026-11-29 20:43");
    }
}

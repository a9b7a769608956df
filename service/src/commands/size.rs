//! Byte sizes on the command line (`0`, `4096`, `512M`, `4G`, `1.5G`, `2TiB`) and in its output.

/// Parses a size; units are powers of 1024 (K, M, G, T, with optional `B`/`iB`).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a size (examples: 0, 512M, 4G)"))?;
    let unit = unit.trim().to_ascii_uppercase();
    let unit = unit.trim_end_matches("IB").trim_end_matches('B');
    let scale: u64 = match unit {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use K, M, G or T)"
            ));
        }
    };
    let bytes = value * scale as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(format!("`{text}` is out of range"));
    }
    Ok(bytes.round() as u64)
}

/// A size given on the command line, or `auto` to let Longhaul work it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeOrAuto {
    Bytes(u64),
    Auto,
}

/// Parses a size (see [`parse_size`]) or `auto`.
pub fn parse_size_or_auto(text: &str) -> Result<SizeOrAuto, String> {
    if text.trim().eq_ignore_ascii_case("auto") {
        return Ok(SizeOrAuto::Auto);
    }
    parse_size(text)
        .map(SizeOrAuto::Bytes)
        .map_err(|e| format!("{e}, or `auto`"))
}

/// A size for people, in powers of 1024: `812 B`, `8.0 MiB`, `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_sizes_in_binary_units() {
        assert_eq!(format_size(812), "812 B");
        assert_eq!(format_size(8 << 20), "8.0 MiB");
        assert_eq!(format_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn parses_common_sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("4G"), Ok(4 << 30));
        assert_eq!(parse_size("1.5g"), Ok(3 << 29));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
    }

    #[test]
    fn auto_is_a_size_too() {
        assert_eq!(parse_size_or_auto("AUTO"), Ok(SizeOrAuto::Auto));
        assert_eq!(parse_size_or_auto("2G"), Ok(SizeOrAuto::Bytes(2 << 30)));
        assert!(parse_size_or_auto("lots").unwrap_err().contains("auto"));
    }

    #[test]
    fn rejects_nonsense() {
        assert!(parse_size("lots").is_err());
        assert!(parse_size("4X").is_err());
        assert!(parse_size("").is_err());
    }
}

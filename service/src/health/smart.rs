//! What a drive says of its own health, from `smartctl --json` (smartmontools
//! 7 and later, on Linux and macOS): typed, with the reason when it says
//! nothing.
//!
//! NVMe drives report one health log (temperature, percentage used, media
//! errors, unsafe shutdowns, minutes above their warning temperature); ATA
//! drives, which USB enclosures with SCSI-to-ATA translation carry, report
//! vendor attributes, read here by their standard numbers. smartctl writes
//! its JSON even when it fails, with its reasons in `smartctl.messages`:
//! those become an [`Unavailable`] saying why ("Unknown USB bridge" is an
//! enclosure that hides the drive; "Unable to detect device type" a virtual
//! disk with no SMART of its own).

use serde::{Deserialize, Serialize};

/// One reading of a drive's health.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ts_rs::TS)]
#[ts(rename = "DiskHealth")]
pub struct Health {
    /// The device smartctl read, `/dev/nvme0`.
    pub device: String,
    pub model: Option<String>,
    pub serial: Option<String>,
    pub firmware: Option<String>,
    /// "NVMe", "ATA" or "SCSI".
    pub protocol: Option<String>,
    /// How smartctl reached it when not directly: "USB NVMe JMicron", "SAT".
    pub through: Option<String>,
    /// The drive's own verdict (SMART overall health, or no NVMe critical warning).
    pub passed: Option<bool>,
    /// NVMe critical warning bits (0 when none).
    pub critical_warning: Option<u8>,
    pub temperature_c: Option<i64>,
    /// Share of the drive's rated endurance used, in percent (may pass 100).
    pub percentage_used: Option<u64>,
    /// NVMe spare capacity left and the threshold under which it warns, in percent.
    pub available_spare: Option<u64>,
    pub available_spare_threshold: Option<u64>,
    /// Media and data integrity errors (NVMe), or uncorrectable errors reported (ATA 187).
    pub media_errors: Option<u64>,
    /// NVMe error information log entries.
    pub error_log_entries: Option<u64>,
    /// Reallocated sectors or NAND blocks (ATA 5).
    pub reallocated: Option<u64>,
    /// Link CRC errors between drive and host (ATA 199): a cable or bridge fault.
    pub crc_errors: Option<u64>,
    /// Power lost without a clean shutdown (NVMe, or ATA 174).
    pub unsafe_shutdowns: Option<u64>,
    pub power_on_hours: Option<u64>,
    /// Minutes the drive ran above its warning / critical temperature, where
    /// it throttles (NVMe).
    pub warning_temp_minutes: Option<u64>,
    pub critical_temp_minutes: Option<u64>,
}

/// Why a drive has no health reading.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unavailable {
    #[error(
        "smartctl is not installed: install smartmontools (apt install smartmontools, brew install smartmontools) to see drive health"
    )]
    NoSmartctl,
    #[error(
        "reading {device}'s health needs administrator rights ({message}); run `sudo longhaul drives health` to see it once"
    )]
    NotPermitted { device: String, message: String },
    #[error(
        "{device} is behind a USB bridge ({bridge}) that does not pass the drive's health through"
    )]
    HiddenByBridge { device: String, bridge: String },
    #[error("{device} reports no health of its own: {why}")]
    NoSmart { device: String, why: String },
    #[error("{device} is asleep; its health is read when it wakes")]
    Asleep { device: String },
    #[error("{device} is gone: {message}")]
    NoDevice { device: String, message: String },
    #[error("{why}")]
    NoBlockDevice { why: String },
    #[error("smartctl could not read {device}: {message}")]
    Failed { device: String, message: String },
}

/// The parts of smartctl's JSON the health view reads; everything optional,
/// since each kind of drive fills in its own.
#[derive(Deserialize)]
struct Output {
    smartctl: Option<Envelope>,
    device: Option<DeviceInfo>,
    model_name: Option<String>,
    serial_number: Option<String>,
    firmware_version: Option<String>,
    smart_status: Option<SmartStatus>,
    nvme_smart_health_information_log: Option<NvmeLog>,
    ata_smart_attributes: Option<AtaAttributes>,
    temperature: Option<Temperature>,
    power_on_time: Option<PowerOnTime>,
}

#[derive(Deserialize)]
struct Envelope {
    #[serde(default)]
    messages: Vec<Message>,
}

#[derive(Deserialize)]
struct Message {
    string: String,
}

#[derive(Deserialize)]
struct DeviceInfo {
    info_name: Option<String>,
    protocol: Option<String>,
}

#[derive(Deserialize)]
struct SmartStatus {
    passed: Option<bool>,
}

/// NVMe counters are 128-bit in the drive; smartctl writes the big ones as
/// plain JSON numbers, which [`count`] saturates rather than refusing.
#[derive(Deserialize)]
struct NvmeLog {
    critical_warning: Option<u8>,
    temperature: Option<i64>,
    available_spare: Option<u64>,
    available_spare_threshold: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    percentage_used: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    unsafe_shutdowns: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    media_errors: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    num_err_log_entries: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    power_on_hours: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    warning_temp_time: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    critical_comp_time: Option<u64>,
}

#[derive(Deserialize)]
struct AtaAttributes {
    #[serde(default)]
    table: Vec<AtaAttribute>,
}

#[derive(Deserialize)]
struct AtaAttribute {
    id: u32,
    value: Option<u64>,
    raw: Option<AtaRaw>,
}

#[derive(Deserialize)]
struct AtaRaw {
    #[serde(default, deserialize_with = "count")]
    value: Option<u64>,
}

#[derive(Deserialize)]
struct Temperature {
    current: Option<i64>,
}

#[derive(Deserialize)]
struct PowerOnTime {
    #[serde(default, deserialize_with = "count")]
    hours: Option<u64>,
}

fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let n: Option<serde_json::Number> = Option::deserialize(d)?;
    Ok(n.and_then(|n| n.as_u64().or_else(|| n.as_f64().map(|f| f.max(0.0) as u64))))
}

/// ATA attribute numbers read, as smartmontools' drive database names them.
mod ata {
    pub const REALLOCATED: u32 = 5;
    pub const POWER_ON_HOURS: u32 = 9;
    pub const UNEXPECTED_POWER_LOSS: u32 = 174;
    pub const REPORTED_UNCORRECTABLE: u32 = 187;
    pub const TEMPERATURE: u32 = 194;
    pub const OFFLINE_UNCORRECTABLE: u32 = 198;
    pub const CRC_ERRORS: u32 = 199;
    /// Attributes whose normalised value is the life left in percent, by
    /// vendor: Samsung's wear levelling, Crucial's lifetime remaining,
    /// Intel's media wearout, SandForce and others' SSD life left.
    pub const LIFE_LEFT: [u32; 4] = [177, 202, 233, 231];
}

/// Reads smartctl's JSON for `device`.
pub fn parse(device: &str, json: &str) -> Result<Health, Unavailable> {
    let out: Output = serde_json::from_str(json).map_err(|e| Unavailable::Failed {
        device: device.to_string(),
        message: format!("its output is not smartctl's JSON ({e})"),
    })?;
    let messages: Vec<String> = out
        .smartctl
        .as_ref()
        .map(|s| s.messages.iter().map(|m| m.string.clone()).collect())
        .unwrap_or_default();
    let has_data = out.model_name.is_some()
        || out.nvme_smart_health_information_log.is_some()
        || out.ata_smart_attributes.is_some();
    if !has_data {
        return Err(why_not(device, &messages));
    }
    let info = out.device.as_ref();
    // smartctl appends how it reached the drive in brackets: "/dev/sda [SAT]".
    let through = info
        .and_then(|d| d.info_name.as_deref())
        .and_then(|n| n.split_once(" ["))
        .map(|(_, rest)| rest.trim_end_matches(']').to_string());
    let mut h = Health {
        device: device.to_string(),
        model: out.model_name,
        serial: out.serial_number,
        firmware: out.firmware_version,
        protocol: info.and_then(|d| d.protocol.clone()),
        through,
        passed: out.smart_status.and_then(|s| s.passed),
        temperature_c: out.temperature.and_then(|t| t.current),
        power_on_hours: out.power_on_time.and_then(|p| p.hours),
        ..Health::default()
    };
    if let Some(log) = out.nvme_smart_health_information_log {
        read_nvme(&mut h, log);
    }
    if let Some(attrs) = out.ata_smart_attributes {
        read_ata(&mut h, &attrs.table);
    }
    Ok(h)
}

fn read_nvme(h: &mut Health, log: NvmeLog) {
    h.critical_warning = log.critical_warning;
    h.temperature_c = h.temperature_c.or(log.temperature);
    h.percentage_used = log.percentage_used;
    h.available_spare = log.available_spare;
    h.available_spare_threshold = log.available_spare_threshold;
    h.media_errors = log.media_errors;
    h.error_log_entries = log.num_err_log_entries;
    h.unsafe_shutdowns = log.unsafe_shutdowns;
    h.power_on_hours = h.power_on_hours.or(log.power_on_hours);
    h.warning_temp_minutes = log.warning_temp_time;
    h.critical_temp_minutes = log.critical_comp_time;
    if h.passed.is_none() {
        h.passed = log.critical_warning.map(|w| w == 0);
    }
}

fn read_ata(h: &mut Health, table: &[AtaAttribute]) {
    let raw = |id: u32| {
        table
            .iter()
            .find(|a| a.id == id)
            .and_then(|a| a.raw.as_ref()?.value)
    };
    h.reallocated = raw(ata::REALLOCATED);
    h.media_errors = raw(ata::REPORTED_UNCORRECTABLE).or(raw(ata::OFFLINE_UNCORRECTABLE));
    h.crc_errors = raw(ata::CRC_ERRORS);
    h.unsafe_shutdowns = raw(ata::UNEXPECTED_POWER_LOSS);
    h.power_on_hours = h.power_on_hours.or(raw(ata::POWER_ON_HOURS));
    // The raw temperature packs minimum and maximum in its upper bytes.
    h.temperature_c = h
        .temperature_c
        .or(raw(ata::TEMPERATURE).map(|r| (r & 0xff) as i64));
    h.percentage_used = ata::LIFE_LEFT.iter().find_map(|&id| {
        let left = table.iter().find(|a| a.id == id)?.value?;
        Some(100u64.saturating_sub(left))
    });
}

/// Why smartctl read no health, from its messages.
fn why_not(device: &str, messages: &[String]) -> Unavailable {
    let device = device.to_string();
    let first = messages
        .first()
        .cloned()
        .unwrap_or_else(|| "smartctl printed no health and no reason".to_string());
    let find = |needle: &str| messages.iter().find(|m| m.contains(needle));
    if let Some(m) = find("Unknown USB bridge") {
        let bridge = m
            .split_once('[')
            .map(|(_, b)| b.trim_end_matches(']').to_string())
            .unwrap_or_else(|| m.clone());
        return Unavailable::HiddenByBridge {
            device,
            bridge: format!("USB id {bridge}"),
        };
    }
    if find("Unable to detect device type").is_some() {
        return Unavailable::NoSmart {
            device,
            why: "smartctl finds no SMART interface on it".into(),
        };
    }
    if let Some(m) = find("Permission denied").or(find("Operation not permitted")) {
        return Unavailable::NotPermitted {
            device,
            message: m.clone(),
        };
    }
    if find("STANDBY").is_some() || find("SLEEP").is_some() {
        return Unavailable::Asleep { device };
    }
    if let Some(m) = find("No such device").or(find("No such file")) {
        return Unavailable::NoDevice {
            device,
            message: m.clone(),
        };
    }
    Unavailable::Failed {
        device,
        message: first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/health")
            .join(name);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn an_nvme_drive_reports_every_field() {
        let h = parse("/dev/nvme0", &fixture("nvme.json")).unwrap();
        assert_eq!(h.model.as_deref(), Some("Samsung SSD 990 PRO 2TB"));
        assert_eq!(h.protocol.as_deref(), Some("NVMe"));
        assert_eq!(h.through, None);
        assert_eq!(h.passed, Some(true));
        assert_eq!(h.critical_warning, Some(0));
        assert_eq!(h.temperature_c, Some(47));
        assert_eq!(h.percentage_used, Some(3));
        assert_eq!(
            (h.available_spare, h.available_spare_threshold),
            (Some(100), Some(10))
        );
        assert_eq!(h.media_errors, Some(0));
        assert_eq!(h.error_log_entries, Some(12));
        assert_eq!(h.unsafe_shutdowns, Some(27));
        assert_eq!(h.power_on_hours, Some(3120));
        assert_eq!(h.warning_temp_minutes, Some(4));
        assert_eq!(h.critical_temp_minutes, Some(0));
        let later = parse("/dev/nvme0", &fixture("nvme-hot-errors.json")).unwrap();
        assert_eq!(later.passed, Some(false));
        assert_eq!(later.critical_warning, Some(2));
        assert_eq!(later.temperature_c, Some(79));
        assert_eq!(later.media_errors, Some(2));
    }

    #[test]
    fn usb_enclosures_that_pass_health_through_say_how() {
        let n = parse("/dev/sda", &fixture("usb-nvme.json")).unwrap();
        assert_eq!(n.through.as_deref(), Some("USB NVMe JMicron"));
        assert_eq!(n.protocol.as_deref(), Some("NVMe"));
        assert_eq!(n.temperature_c, Some(52));
        let s = parse("/dev/sdb", &fixture("usb-sat.json")).unwrap();
        assert_eq!(s.through.as_deref(), Some("SAT"));
        assert_eq!(s.protocol.as_deref(), Some("ATA"));
        assert_eq!(s.model.as_deref(), Some("CT2000MX500SSD1"));
        assert_eq!(s.temperature_c, Some(38));
        assert_eq!(s.percentage_used, Some(6), "Percent_Lifetime_Remain 94");
        assert_eq!(s.unsafe_shutdowns, Some(57));
        assert_eq!(s.media_errors, Some(1));
        assert_eq!(s.crc_errors, Some(3));
        assert_eq!(s.reallocated, Some(0));
        assert_eq!(s.power_on_hours, Some(8812));
        assert_eq!(s.critical_warning, None);
    }

    #[test]
    fn drives_without_health_say_why() {
        let cases = [
            (
                "/dev/sdc",
                "usb-hidden.json",
                "does not pass the drive's health through",
            ),
            ("/dev/vda", "virtio.json", "reports no health of its own"),
            ("/dev/loop0", "loop.json", "reports no health of its own"),
            (
                "/dev/vda",
                "not-permitted.json",
                "needs administrator rights",
            ),
            ("/dev/nosuch", "no-device.json", "is gone"),
            ("/dev/sdd", "standby.json", "is asleep"),
        ];
        for (device, file, says) in cases {
            let why = parse(device, &fixture(file)).unwrap_err();
            assert!(why.to_string().contains(says), "{file}: {why}");
            assert!(why.to_string().contains(device), "{file}: {why}");
        }
        let hidden = parse("/dev/sdc", &fixture("usb-hidden.json")).unwrap_err();
        assert!(hidden.to_string().contains("0x152d:0x0578"), "{hidden}");
    }

    #[test]
    fn output_that_is_not_smartctls_is_an_error_naming_the_device() {
        let why = parse("/dev/x", "smartctl: command output cut").unwrap_err();
        assert!(matches!(why, Unavailable::Failed { .. }));
        assert!(why.to_string().contains("/dev/x"), "{why}");
    }

    #[test]
    fn counters_past_64_bits_saturate() {
        let json = r#"{"model_name":"X","nvme_smart_health_information_log":
            {"media_errors": 340282366920938463463374607431768211455, "temperature": 30}}"#;
        let h = parse("/dev/x", json).unwrap();
        assert_eq!(h.media_errors, Some(u64::MAX));
        assert_eq!(h.temperature_c, Some(30));
    }
}

//! Which physical drive a folder is on, and how it is attached.
//!
//! A pack names folders; SMART is per device, and the link (NVMe on PCIe,
//! USB, Thunderbolt) decides what the drive can read at. On Linux the
//! folder's file-system device id leads through `/sys/dev/block` to the
//! disk, following loop devices to their backing file's drive and
//! device-mapper volumes (LVM, LUKS) to the one disk under them; the sysfs
//! path says the transport and the PCIe or USB device's own files its speed.
//! On macOS `diskutil info -plist` names the whole disk and its bus (see
//! [`super::diskutil`]).

use std::path::Path;

use serde::Serialize;

use super::smart::Unavailable;

/// The disk under a folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BlockDevice {
    /// What smartctl is given: `/dev/nvme0n1`, `/dev/sda`, `/dev/disk4`.
    pub node: String,
    pub link: Link,
    /// The layers between the folder and the disk, outermost first:
    /// "loop0 over /srv/drive1.img", "dm-0 (cryptroot)".
    pub via: Vec<String>,
}

/// How a disk is attached, as far as the system says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Link {
    /// On PCIe; `pcie` is the link's speed and width when the system says.
    Nvme {
        pcie: Option<String>,
    },
    /// Through USB; `speed` is the port's negotiated speed.
    Usb {
        speed: Option<String>,
    },
    Thunderbolt,
    Sata,
    /// A disk the machine's host or hypervisor provides (virtio, Xen).
    Virtual {
        what: String,
    },
    Other {
        what: String,
    },
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Link::Nvme { pcie: Some(p) } => write!(f, "NVMe, {p}"),
            Link::Nvme { pcie: None } => write!(f, "NVMe"),
            Link::Usb { speed: Some(s) } => write!(f, "USB {s}"),
            Link::Usb { speed: None } => write!(f, "USB"),
            Link::Thunderbolt => write!(f, "Thunderbolt"),
            Link::Sata => write!(f, "SATA"),
            Link::Virtual { what } => write!(f, "virtual disk ({what})"),
            Link::Other { what } => write!(f, "{what}"),
        }
    }
}

/// The transport a Linux sysfs device path shows, and the directory whose
/// files hold its speed (the PCIe function of an NVMe drive, the USB
/// device of an enclosure).
pub fn classify_sysfs(path: &str) -> (Link, Option<String>) {
    let parts: Vec<&str> = path.split('/').collect();
    if let Some(i) = parts.iter().position(|p| *p == "nvme") {
        return (Link::Nvme { pcie: None }, Some(parts[..i].join("/")));
    }
    if path.contains("/usb") {
        // The USB device is the last component like "2-1" or "2-1.4" (an
        // interface has a colon: "2-1:1.0").
        let usb = parts.iter().rposition(|p| {
            p.split_once('-').is_some_and(|(bus, port)| {
                !bus.is_empty()
                    && bus.bytes().all(|b| b.is_ascii_digit())
                    && !port.contains(':')
                    && port.bytes().all(|b| b.is_ascii_digit() || b == b'.')
            })
        });
        return (
            Link::Usb { speed: None },
            usb.map(|i| parts[..=i].join("/")),
        );
    }
    if path.contains("/thunderbolt") {
        return (Link::Thunderbolt, None);
    }
    if let Some(v) = parts.iter().find(|p| p.starts_with("virtio")) {
        let what = v.trim_end_matches(|c: char| c.is_ascii_digit());
        return (Link::Virtual { what: what.into() }, None);
    }
    if path.contains("/vbd-") || path.contains("/xen") {
        return (Link::Virtual { what: "Xen".into() }, None);
    }
    if parts
        .iter()
        .any(|p| p.starts_with("ata") && p[3..].bytes().all(|b| b.is_ascii_digit()))
    {
        return (Link::Sata, None);
    }
    (
        Link::Other {
            what: "an attached disk".into(),
        },
        None,
    )
}

/// A PCIe link's words from sysfs ("16.0 GT/s PCIe", "4"): "PCIe 16.0 GT/s x4".
pub fn pcie_words(speed: &str, width: &str) -> Option<String> {
    let speed = speed.trim().trim_end_matches("PCIe").trim();
    let width = width.trim();
    if speed.is_empty() || speed.starts_with("Unknown") {
        return None;
    }
    Some(if width.is_empty() {
        format!("PCIe {speed}")
    } else {
        format!("PCIe {speed} x{width}")
    })
}

/// A USB port's speed from sysfs, in Mb/s ("480", "5000"): "480 Mb/s", "5 Gb/s".
pub fn usb_words(mbps: &str) -> Option<String> {
    let n: f64 = mbps.trim().parse().ok()?;
    Some(if n >= 1000.0 {
        format!("{} Gb/s", n / 1000.0)
    } else {
        format!("{n} Mb/s")
    })
}

/// The disk under `folder`.
pub fn resolve(folder: &Path) -> Result<BlockDevice, Unavailable> {
    platform::resolve(folder, 0)
}

fn no_device(folder: &Path, why: impl std::fmt::Display) -> Unavailable {
    Unavailable::NoBlockDevice {
        why: format!("{}: {why}", folder.display()),
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;

    /// How deep loop devices and volumes are followed before giving up.
    const MAX_LAYERS: usize = 4;

    pub fn resolve(folder: &Path, depth: usize) -> Result<BlockDevice, Unavailable> {
        let meta = std::fs::metadata(folder).map_err(|e| no_device(folder, e))?;
        let dev = meta.dev();
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        if major == 0 {
            return Err(no_device(
                folder,
                "its file system has no disk of its own (tmpfs, overlay or a network share)",
            ));
        }
        let sys =
            std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).map_err(|e| {
                no_device(
                    folder,
                    format!("device {major}:{minor} is not in sysfs ({e})"),
                )
            })?;
        from_sysfs(folder, &sys, depth)
    }

    fn read(path: impl AsRef<Path>) -> Option<String> {
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn from_sysfs(folder: &Path, sys: &Path, depth: usize) -> Result<BlockDevice, Unavailable> {
        if depth > MAX_LAYERS {
            return Err(no_device(
                folder,
                "too many loop devices or volumes to follow",
            ));
        }
        let disk: PathBuf = if sys.join("partition").exists() {
            sys.parent()
                .map_or_else(|| sys.to_path_buf(), Path::to_path_buf)
        } else {
            sys.to_path_buf()
        };
        let name = disk
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with("loop") {
            let backing = read(disk.join("loop/backing_file"))
                .ok_or_else(|| no_device(folder, format!("{name} has no backing file")))?;
            let mut d = resolve(Path::new(&backing), depth + 1)?;
            d.via.insert(0, format!("{name} over {backing}"));
            return Ok(d);
        }
        if name.starts_with("dm-") || name.starts_with("md") {
            let label = read(disk.join("dm/name")).unwrap_or_default();
            let under: Vec<String> = std::fs::read_dir(disk.join("slaves"))
                .map(|r| {
                    r.filter_map(Result::ok)
                        .map(|e| e.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            let [one] = under.as_slice() else {
                return Err(no_device(
                    folder,
                    format!("{name} spans {} disks ({})", under.len(), under.join(", ")),
                ));
            };
            let next = std::fs::canonicalize(format!("/sys/class/block/{one}"))
                .map_err(|e| no_device(folder, format!("{one}: {e}")))?;
            let mut d = from_sysfs(folder, &next, depth + 1)?;
            d.via.insert(
                0,
                if label.is_empty() {
                    name
                } else {
                    format!("{name} ({label})")
                },
            );
            return Ok(d);
        }
        let (mut link, speed_dir) = classify_sysfs(&disk.to_string_lossy());
        if let Some(dir) = speed_dir.map(PathBuf::from) {
            match &mut link {
                Link::Nvme { pcie } => {
                    *pcie = pcie_words(
                        &read(dir.join("current_link_speed")).unwrap_or_default(),
                        &read(dir.join("current_link_width")).unwrap_or_default(),
                    );
                }
                Link::Usb { speed } => *speed = read(dir.join("speed")).and_then(|s| usb_words(&s)),
                _ => {}
            }
        }
        Ok(BlockDevice {
            node: format!("/dev/{name}"),
            link,
            via: Vec::new(),
        })
    }
}

#[cfg(target_os = "macos")]
mod platform {
    use super::super::diskutil::{DiskInfo, Next};
    use super::*;

    /// `diskutil info -plist DISK`, read.
    fn diskutil(folder: &Path, disk: &str) -> Result<DiskInfo, Unavailable> {
        let out = std::process::Command::new("diskutil")
            .args(["info", "-plist", disk])
            .output()
            .map_err(|e| no_device(folder, format!("diskutil: {e}")))?;
        DiskInfo::parse(&out.stdout).map_err(|e| no_device(folder, format!("diskutil: {e}")))
    }

    pub fn resolve(folder: &Path, _depth: usize) -> Result<BlockDevice, Unavailable> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(folder.as_os_str().as_bytes())
            .map_err(|e| no_device(folder, e))?;
        let mut s: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a valid NUL-terminated path and `s` a writable statfs.
        if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
            return Err(no_device(folder, std::io::Error::last_os_error()));
        }
        // SAFETY: statfs fills f_mntfromname with a NUL-terminated string.
        let from = unsafe { std::ffi::CStr::from_ptr(s.f_mntfromname.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        if !from.starts_with("/dev/disk") {
            return Err(no_device(
                folder,
                format!("it is mounted from {from}, not a disk"),
            ));
        }
        let volume = diskutil(folder, &from)?;
        let (node, link) = match volume.next() {
            Next::Whole(node) => (node, volume.link()),
            Next::Store(store) => {
                let store = diskutil(folder, &store)?;
                match store.next() {
                    Next::Whole(node) => (node, store.link()),
                    _ => {
                        return Err(no_device(
                            folder,
                            "diskutil names no disk under its APFS store",
                        ));
                    }
                }
            }
            Next::Unknown => {
                return Err(no_device(
                    folder,
                    format!("diskutil names no whole disk for {from}"),
                ));
            }
        };
        Ok(BlockDevice {
            node,
            link,
            via: Vec::new(),
        })
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    use super::*;

    pub fn resolve(folder: &Path, _depth: usize) -> Result<BlockDevice, Unavailable> {
        Err(no_device(
            folder,
            "finding its disk is not supported on this system",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_paths_name_the_transport_and_where_its_speed_is() {
        let nvme = "/sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1";
        assert_eq!(
            classify_sysfs(nvme),
            (
                Link::Nvme { pcie: None },
                Some("/sys/devices/pci0000:00/0000:00:1d.0/0000:3d:00.0".into())
            )
        );
        let usb = "/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.4/2-1.4:1.0/host4/target4:0:0/4:0:0:0/block/sda";
        assert_eq!(
            classify_sysfs(usb),
            (
                Link::Usb { speed: None },
                Some("/sys/devices/pci0000:00/0000:00:14.0/usb2/2-1/2-1.4".into())
            )
        );
        // Recorded on a virtual machine.
        let virtio = "/sys/devices/pci0000:00/0000:00:02.0/virtio1/block/vda";
        assert_eq!(
            classify_sysfs(virtio).0,
            Link::Virtual {
                what: "virtio".into()
            }
        );
        let sata = "/sys/devices/pci0000:00/0000:00:17.0/ata3/host2/target2:0:0/2:0:0:0/block/sda";
        assert_eq!(classify_sysfs(sata).0, Link::Sata);
    }

    #[test]
    fn link_speeds_read_as_people_say_them() {
        assert_eq!(
            pcie_words("16.0 GT/s PCIe\n", "4\n").as_deref(),
            Some("PCIe 16.0 GT/s x4")
        );
        assert_eq!(pcie_words("Unknown", "0"), None);
        assert_eq!(usb_words("10000\n").as_deref(), Some("10 Gb/s"));
        assert_eq!(usb_words("480").as_deref(), Some("480 Mb/s"));
        assert_eq!(
            Link::Nvme {
                pcie: Some("PCIe 8.0 GT/s x4".into())
            }
            .to_string(),
            "NVMe, PCIe 8.0 GT/s x4"
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_temporary_folder_resolves_to_a_disk_or_says_why() {
        let dir = tempfile::tempdir().unwrap();
        match resolve(dir.path()) {
            Ok(d) => assert!(d.node.starts_with("/dev/"), "{d:?}"),
            Err(why) => assert!(
                why.to_string().contains(&dir.path().display().to_string()),
                "{why}"
            ),
        }
        let why = resolve(Path::new("/proc")).unwrap_err();
        assert!(why.to_string().contains("no disk of its own"), "{why}");
        let gone = resolve(&dir.path().join("gone")).unwrap_err();
        assert!(gone.to_string().contains("gone"), "{gone}");
    }
}

//! Reading `diskutil info -plist`, macOS's account of a disk, partition or
//! volume, for the physical drive under a folder and how it is attached.
//!
//! Public recordings of real outputs decided what is read and how (no
//! recording of an NVMe Thunderbolt enclosure was found; that case is
//! read from what diskutil says of other external PCIe and Thunderbolt
//! disks):
//! - an APFS volume's `ParentWholeDisk` is its container, a disk macOS
//!   synthesizes; the drive is the whole disk of the container's physical
//!   store (`APFSPhysicalStores`), which takes a second `diskutil info`;
//! - `BusProtocol` names the bus the disk's own controller is on: an
//!   internal Apple SSD says `Apple Fabric` (Apple Silicon) or
//!   `PCI-Express`/`PCI` (Intel), a Thunderbolt enclosure says what is
//!   inside it (`SATA` for a G-DRIVE PRO; `PCI-Express` for NVMe) with
//!   `Internal` false, and a USB bridge says `USB`;
//! - `SolidState` is absent behind USB bridges, SSD or not;
//! - a path diskutil cannot map (a network share) prints a plist with
//!   `Error` and `ErrorMessage` and exits non-zero.

use serde::Deserialize;

use super::device::Link;

/// What `diskutil info -plist` says of one disk, partition or volume, as
/// far as finding the drive needs.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct DiskInfo {
    pub device_identifier: Option<String>,
    /// The whole disk this one is on (for an APFS volume, its container).
    pub parent_whole_disk: Option<String>,
    pub bus_protocol: Option<String>,
    pub internal: Option<bool>,
    /// Absent behind USB bridges.
    pub solid_state: Option<bool>,
    /// An APFS volume's or container's physical stores (`disk0s2`).
    #[serde(rename = "APFSPhysicalStores", default)]
    pub physical_stores: Vec<PhysicalStore>,
    /// Set, with `ErrorMessage`, when diskutil could not map the path.
    #[serde(default)]
    pub error: bool,
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PhysicalStore {
    #[serde(rename = "APFSPhysicalStore")]
    pub store: String,
}

impl DiskInfo {
    /// Reads diskutil's property list; an error plist reads as its message.
    pub fn parse(plist: &[u8]) -> Result<Self, String> {
        let info: Self = plist::from_bytes(plist)
            .map_err(|e| format!("diskutil's answer is not a property list it writes: {e}"))?;
        if info.error {
            return Err(info
                .error_message
                .unwrap_or_else(|| "diskutil reports an error".into()));
        }
        Ok(info)
    }

    /// Where the drive is to be found: the physical store of an APFS
    /// volume or container (to be read in turn), else this disk's whole disk.
    pub fn next(&self) -> Next {
        match (self.physical_stores.first(), &self.parent_whole_disk) {
            (Some(store), _) => Next::Store(store.store.clone()),
            (None, Some(whole)) => Next::Whole(format!("/dev/{whole}")),
            (None, None) => Next::Unknown,
        }
    }

    /// How the disk is attached, from its bus and whether it is inside.
    pub fn link(&self) -> Link {
        let external = self.internal == Some(false);
        match self.bus_protocol.as_deref() {
            Some("Apple Fabric") => Link::Nvme {
                pcie: Some("Apple internal".into()),
            },
            // PCIe outside the machine is a Thunderbolt (or USB4) tunnel.
            Some("PCI-Express" | "PCI") if external => Link::Thunderbolt,
            Some("PCI-Express" | "PCI") => Link::Nvme { pcie: None },
            Some("USB") => Link::Usb { speed: None },
            Some("Thunderbolt") => Link::Thunderbolt,
            Some("SATA") => Link::Sata,
            Some("Disk Image") => Link::Virtual {
                what: "disk image".into(),
            },
            Some(other) => Link::Other { what: other.into() },
            None => Link::Other {
                what: "an attached disk".into(),
            },
        }
    }
}

/// Where to look next for a volume's drive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// This node is the drive.
    Whole(String),
    /// An APFS physical store (`disk0s2`): its own whole disk is the drive.
    Store(String),
    /// diskutil names no whole disk.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> DiskInfo {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/diskutil")
            .join(name);
        let bytes = std::fs::read(&path).unwrap();
        DiskInfo::parse(&bytes).unwrap()
    }

    #[test]
    fn an_apple_silicon_data_volume_leads_through_its_physical_store() {
        let volume = fixture("apple-fabric-data-volume.plist");
        assert_eq!(volume.next(), Next::Store("disk0s2".into()));
        let store = fixture("apple-fabric-physical-store.plist");
        assert_eq!(store.next(), Next::Whole("/dev/disk0".into()));
        assert_eq!(
            store.link(),
            Link::Nvme {
                pcie: Some("Apple internal".into())
            }
        );
    }

    #[test]
    fn nvme_in_a_thunderbolt_enclosure_is_pcie_outside_the_machine() {
        let volume = fixture("thunderbolt-nvme-volume.plist");
        assert_eq!(volume.next(), Next::Store("disk5s2".into()));
        let store = fixture("thunderbolt-nvme-physical-store.plist");
        assert_eq!(store.next(), Next::Whole("/dev/disk5".into()));
        assert_eq!(store.link(), Link::Thunderbolt);
    }

    #[test]
    fn a_usb_bridge_says_usb_and_nothing_of_solid_state() {
        let volume = fixture("usb-sata-bridge-volume.plist");
        assert_eq!(volume.next(), Next::Whole("/dev/disk4".into()));
        assert_eq!(volume.link(), Link::Usb { speed: None });
        assert_eq!(volume.solid_state, None);
    }

    #[test]
    fn a_path_diskutil_cannot_map_reads_as_its_message() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/diskutil/network-volume-error.plist");
        let err = DiskInfo::parse(&std::fs::read(path).unwrap()).unwrap_err();
        assert_eq!(err, "Could not find disk: /Volumes/Share");
        assert!(DiskInfo::parse(b"Could not find disk").is_err());
    }
}

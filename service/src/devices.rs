//! Which drive folders share a device. Striping a pack over folders on one
//! disk reads no faster than one folder (the disk's own ceiling is shared),
//! yet nothing in the folders says so: four folders on one disk packed
//! without a word, and a probe then reported 4 × 317 MB/s "from all its
//! drives". The file system's device id tells them apart.

use std::path::{Path, PathBuf};

/// Groups of folders (by index in `folders`) that are on one device, each
/// of two or more, in the order first met. Folders that cannot be read are
/// left out (they are reported where they are used).
pub fn shared(folders: &[PathBuf]) -> Vec<Vec<usize>> {
    let mut groups: Vec<(u64, Vec<usize>)> = Vec::new();
    for (i, folder) in folders.iter().enumerate() {
        let Some(dev) = device(folder) else {
            continue;
        };
        match groups.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, members)) => members.push(i),
            None => groups.push((dev, vec![i])),
        }
    }
    groups
        .into_iter()
        .filter(|(_, m)| m.len() > 1)
        .map(|(_, m)| m)
        .collect()
}

/// One line per group of folders on one device, saying what it costs.
pub fn warnings(folders: &[PathBuf]) -> Vec<String> {
    shared(folders)
        .into_iter()
        .map(|group| {
            let names: Vec<String> = group
                .iter()
                .map(|&i| folders[i].display().to_string())
                .collect();
            format!(
                "{} are on one device: striping over them reads no faster than one of them",
                names.join(", ")
            )
        })
        .collect()
}

#[cfg(unix)]
fn device(folder: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(folder).ok().map(|m| m.dev())
}

#[cfg(not(unix))]
fn device(_folder: &Path) -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_on_one_device_are_grouped_and_a_missing_one_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::create_dir(&a).unwrap();
        std::fs::create_dir(&b).unwrap();
        let folders = vec![a, dir.path().join("gone"), b];
        assert_eq!(shared(&folders), vec![vec![0, 2]]);
        let said = warnings(&folders);
        assert_eq!(said.len(), 1);
        assert!(said[0].contains("are on one device"), "{said:?}");
        // /proc is its own file system.
        let apart = vec![folders[0].clone(), PathBuf::from("/proc")];
        assert!(shared(&apart).is_empty());
    }
}

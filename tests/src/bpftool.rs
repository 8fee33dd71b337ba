//! What the kernel holds, read with `bpftool`: pinned maps and their entries, loaded programs,
//! and where programs are attached. The tests ask the kernel rather than the proxy, so a leak
//! the proxy does not know about still shows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// `bpftool --json <args>`, parsed. A listing walks object ids and then opens each one; an
/// object of a parallel test that goes away in between fails the whole listing, so it is tried
/// a few times.
pub fn json(args: &[&str]) -> serde_json::Value {
    let mut attempt = 0;
    let out = loop {
        let out = Command::new("bpftool")
            .arg("--json")
            .args(args)
            .output()
            .expect("run bpftool");
        attempt += 1;
        if out.status.success() || attempt == 5 {
            break out;
        }
        // A synchronous helper; 50 ms on a listing that just failed.
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        out.status.success(),
        "bpftool {args:?}: {}{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).expect("bpftool json")
}

/// `bpftool map dump pinned <pin>` as bpftool prints it for people (BTF-formatted, one field a
/// line), echoed to the test's output.
pub fn dump_text(pin: &Path) -> String {
    let out = Command::new("bpftool")
        .args(["map", "dump", "pinned"])
        .arg(pin)
        .output()
        .expect("run bpftool");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("bpftool map dump pinned {}:\n{text}", pin.display());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// Entries in a pinned map (0 if the map is empty).
pub fn map_entries(pin: &Path) -> usize {
    json(&["map", "dump", "pinned", utf8(pin)])
        .as_array()
        .map_or(0, Vec::len)
}

/// The names in a pinned HOSTS map.
pub fn host_names(pins: &Path) -> BTreeSet<String> {
    let hosts = pins.join("hosts");
    json(&["map", "dump", "pinned", utf8(&hosts)])
        .as_array()
        .expect("a dump")
        .iter()
        // With --json, bpftool gives the raw bytes as "key" and the BTF view as "formatted".
        .map(|entry| {
            entry["formatted"]["key"]["name"]
                .as_str()
                .unwrap_or_else(|| panic!("no readable name in {entry}"))
                .to_string()
        })
        .collect()
}

/// Ids of the maps pinned under `pins`, by pin name.
pub fn pinned_maps(pins: &Path) -> BTreeMap<String, u64> {
    std::fs::read_dir(pins)
        .expect("pin dir")
        .map(|entry| {
            entry
                .expect("pin")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .map(|name| {
            let pin = pins.join(&name);
            let info = json(&["map", "show", "pinned", utf8(&pin)]);
            (name, info["id"].as_u64().expect("map id"))
        })
        .collect()
}

/// Loaded programs using any of `maps`: (id, name).
pub fn programs_using(maps: &BTreeSet<u64>) -> Vec<(u64, String)> {
    json(&["prog", "show"])
        .as_array()
        .expect("programs")
        .iter()
        .filter(|p| {
            p["map_ids"].as_array().is_some_and(|ids| {
                ids.iter()
                    .any(|id| id.as_u64().is_some_and(|id| maps.contains(&id)))
            })
        })
        .map(|p| {
            (
                p["id"].as_u64().expect("prog id"),
                p["name"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// TCX links by program id, counted. bpftool 7.1 (Debian's) names the type only by number (11,
/// BPF_LINK_TYPE_TCX) and shows no device; newer ones say "tcx".
pub fn tc_attached() -> BTreeMap<u64, usize> {
    let mut found = BTreeMap::<u64, usize>::new();
    for link in json(&["link", "show"]).as_array().expect("links") {
        let tcx = link["type"] == "tcx" || link["type"] == 11;
        if let (true, Some(id)) = (tcx, link["prog_id"].as_u64()) {
            *found.entry(id).or_default() += 1;
        }
    }
    found
}

/// Every program id attached to some cgroup.
pub fn cgroup_attached() -> BTreeSet<u64> {
    json(&["cgroup", "tree"])
        .as_array()
        .expect("cgroups")
        .iter()
        .flat_map(|cg| cg["programs"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["id"].as_u64())
        .collect()
}

/// Whether the kernel still has map `id`.
pub fn map_exists(id: u64) -> bool {
    Command::new("bpftool")
        .args(["map", "show", "id", &id.to_string()])
        .output()
        .expect("bpftool")
        .status
        .success()
}

fn utf8(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

//! `/etc/docker/daemon.json`: adding the `nvidia` runtime and `live-restore` while keeping
//! everything else.
//!
//! The owner's file may carry `log-opts`, `data-root`, `registry-mirrors` and anything else; gpum
//! adds exactly what `nvidia-ctk runtime configure --runtime=docker` adds
//! (`"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}`) and
//! `"live-restore": true` (a dockerd restart leaves running containers, a rental's too, running;
//! a reload applies it), and nothing more.
//! Every other key keeps its value *and its place*: [`Json`] is an order-preserving JSON tree
//! (serde_json's own map sorts keys unless a workspace-wide feature is switched on), so the file
//! the owner reads afterwards differs from theirs by the added entry only. Like nvidia-ctk, the
//! result is indented with four spaces.
//!
//! A file that is not a JSON object is refused, never replaced: the caller stops with a message
//! naming the file.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};

/// The runtime's name in `runtimes`.
pub const RUNTIME: &str = "nvidia";
/// What nvidia-ctk writes as its `path`.
pub const RUNTIME_PATH: &str = "nvidia-container-runtime";

/// A JSON value whose objects keep their keys in file order.
#[derive(Debug, Clone, PartialEq)]
pub enum Json {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    fn get_mut(&mut self, key: &str) -> Option<&mut Json> {
        match self {
            Json::Object(m) => m.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(m) => m.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }
}

/// Why a `daemon.json` cannot be merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MergeError {
    #[error("not valid JSON: {0}")]
    Invalid(String),
    #[error("the top level is not a JSON object")]
    NotAnObject,
    #[error("\"runtimes\" is not a JSON object")]
    RuntimesNotAnObject,
}

/// What a merge decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Merged {
    /// The runtime is already declared: nothing to write.
    Unchanged,
    /// The new text to write.
    Changed(String),
}

/// The key that keeps containers running while dockerd restarts.
pub const LIVE_RESTORE: &str = "live-restore";

/// Adds the `nvidia` runtime and, with `live_restore`, `"live-restore": true` to `old` (`None`:
/// the file does not exist). An existing `nvidia` entry is left as the owner wrote it; an
/// existing `live-restore` other than `true` is set to `true` where it stands.
pub fn configure(old: Option<&str>, live_restore: bool) -> Result<Merged, MergeError> {
    let mut doc = match old {
        None => Json::Object(Vec::new()),
        Some(t) if t.trim().is_empty() => Json::Object(Vec::new()),
        Some(t) => serde_json::from_str::<Json>(t).map_err(|e| MergeError::Invalid(e.to_string()))?,
    };
    let Json::Object(_) = doc else { return Err(MergeError::NotAnObject) };
    let has_runtime = match doc.get("runtimes") {
        Some(r @ Json::Object(_)) => r.get(RUNTIME).is_some(),
        Some(_) => return Err(MergeError::RuntimesNotAnObject),
        None => false,
    };
    let live_restore = !live_restore || doc.get(LIVE_RESTORE) == Some(&Json::Bool(true));
    if has_runtime && live_restore {
        return Ok(Merged::Unchanged);
    }
    if !live_restore {
        match doc.get_mut(LIVE_RESTORE) {
            Some(v) => *v = Json::Bool(true),
            None => {
                if let Json::Object(m) = &mut doc {
                    m.push((LIVE_RESTORE.into(), Json::Bool(true)));
                }
            }
        }
    }
    if has_runtime {
        return Ok(Merged::Changed(to_text(&doc)));
    }
    let entry = Json::Object(vec![
        ("args".into(), Json::Array(Vec::new())),
        ("path".into(), Json::String(RUNTIME_PATH.into())),
    ]);
    match doc.get_mut("runtimes") {
        Some(Json::Object(m)) => m.push((RUNTIME.into(), entry)),
        _ => {
            if let Json::Object(m) = &mut doc {
                m.push(("runtimes".into(), Json::Object(vec![(RUNTIME.into(), entry)])));
            }
        }
    }
    Ok(Merged::Changed(to_text(&doc)))
}

/// Four-space indentation and a final newline, as nvidia-ctk writes it.
fn to_text(doc: &Json) -> String {
    let mut buf = Vec::new();
    let fmt = serde_json::ser::PrettyFormatter::with_indent(b"    ");
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, fmt);
    // Serializing an in-memory tree into a Vec cannot fail.
    let _ = doc.serialize(&mut ser);
    let mut s = String::from_utf8(buf).unwrap_or_default();
    s.push('\n');
    s
}

impl Serialize for Json {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Number(n) => n.serialize(s),
            Json::String(t) => s.serialize_str(t),
            Json::Array(a) => {
                let mut seq = s.serialize_seq(Some(a.len()))?;
                for v in a {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Json::Object(m) => {
                let mut map = s.serialize_map(Some(m.len()))?;
                for (k, v) in m {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Json;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_unit<E>(self) -> Result<Json, E> {
                Ok(Json::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<Json, E> {
                Ok(Json::Bool(b))
            }
            fn visit_i64<E>(self, n: i64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_u64<E>(self, n: u64) -> Result<Json, E> {
                Ok(Json::Number(n.into()))
            }
            fn visit_f64<E: de::Error>(self, n: f64) -> Result<Json, E> {
                serde_json::Number::from_f64(n)
                    .map(Json::Number)
                    .ok_or_else(|| E::custom("not a finite number"))
            }
            fn visit_str<E>(self, s: &str) -> Result<Json, E> {
                Ok(Json::String(s.to_string()))
            }
            fn visit_string<E>(self, s: String) -> Result<Json, E> {
                Ok(Json::String(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Json::Array(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Json, A::Error> {
                let mut m: Vec<(String, Json)> = Vec::new();
                while let Some((k, v)) = a.next_entry::<String, Json>()? {
                    // A repeated key: the last one wins, as for Docker's own parser (Go).
                    match m.iter_mut().find(|(kk, _)| *kk == k) {
                        Some(slot) => slot.1 = v,
                        None => m.push((k, v)),
                    }
                }
                Ok(Json::Object(m))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OWNER: &str = r#"{
  "log-opts": {"max-size": "10m", "max-file": "3"},
  "data-root": "/data/docker",
  "registry-mirrors": ["https://mirror.example"],
  "mtu": 1400,
  "debug": false
}"#;

    #[test]
    fn keeps_every_key_and_its_order_and_adds_only_the_runtime() {
        let Merged::Changed(t) = configure(Some(OWNER), true).unwrap() else { panic!() };
        let keys: Vec<usize> = [
            "log-opts",
            "max-size",
            "max-file",
            "data-root",
            "registry-mirrors",
            "mtu",
            "debug",
            "live-restore",
            "runtimes",
        ]
        .iter()
        .map(|k| t.find(&format!("\"{k}\"")).unwrap_or_else(|| panic!("{k} lost in {t}")))
        .collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "order changed: {t}");
        let old: serde_json::Value = serde_json::from_str(OWNER).unwrap();
        let mut new: serde_json::Value = serde_json::from_str(&t).unwrap();
        assert_eq!(new["runtimes"]["nvidia"]["path"], RUNTIME_PATH);
        assert_eq!(new["runtimes"]["nvidia"]["args"], serde_json::json!([]));
        assert_eq!(new["live-restore"], true);
        new.as_object_mut().unwrap().remove("runtimes");
        new.as_object_mut().unwrap().remove("live-restore");
        assert_eq!(new, old, "nothing else may change");
        assert!(t.contains("\n    \"log-opts\""), "four-space indent like nvidia-ctk: {t}");
        // Merging again changes nothing.
        assert_eq!(configure(Some(&t), true).unwrap(), Merged::Unchanged);
    }

    #[test]
    fn other_runtimes_stay_and_an_existing_nvidia_entry_is_the_owners() {
        let t = r#"{"runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}"#;
        let Merged::Changed(out) = configure(Some(t), true).unwrap() else { panic!() };
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["runtimes"]["runsc"]["path"], "/usr/bin/runsc");
        assert!(out.find("runsc").unwrap() < out.find("nvidia").unwrap());
        let own = r#"{"runtimes": {"nvidia": {"path": "/opt/custom-runtime"}}, "live-restore": true}"#;
        assert_eq!(configure(Some(own), true).unwrap(), Merged::Unchanged);
        // The owner's runtime stays; only live-restore is added.
        let own = r#"{"runtimes": {"nvidia": {"path": "/opt/custom-runtime"}}}"#;
        let Merged::Changed(out) = configure(Some(own), true).unwrap() else { panic!() };
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"runtimes": {"nvidia": {"path": "/opt/custom-runtime"}}, "live-restore": true})
        );
    }

    #[test]
    fn live_restore_off_is_turned_on_where_it_stands() {
        let t = r#"{"debug": true, "live-restore": false, "mtu": 1400}"#;
        let Merged::Changed(out) = configure(Some(t), true).unwrap() else { panic!() };
        let (d, l, m) =
            (out.find("debug").unwrap(), out.find("live-restore").unwrap(), out.find("mtu").unwrap());
        assert!(d < l && l < m, "in place: {out}");
        assert!(out.contains("\"live-restore\": true"));
        assert_eq!(configure(Some(&out), true).unwrap(), Merged::Unchanged);
    }

    #[test]
    fn absent_or_empty_file_gets_just_the_runtime() {
        for old in [None, Some(""), Some("  \n")] {
            let Merged::Changed(t) = configure(old, true).unwrap() else { panic!() };
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            assert_eq!(
                v,
                serde_json::json!({"live-restore": true, "runtimes": {"nvidia": {"args": [], "path": RUNTIME_PATH}}})
            );
        }
    }

    #[test]
    fn without_live_restore_only_the_runtime_is_added() {
        // dockerd runs with --live-restore: the key in the file too would stop it.
        let Merged::Changed(t) = configure(Some("{\"log-level\": \"warn\"}"), false).unwrap() else {
            panic!()
        };
        assert!(!t.contains(LIVE_RESTORE) && t.contains(RUNTIME_PATH), "{t}");
        assert_eq!(configure(Some(&t), false).unwrap(), Merged::Unchanged);
        let Merged::Changed(t) = configure(None, false).unwrap() else { panic!() };
        assert!(!t.contains(LIVE_RESTORE), "{t}");
    }

    #[test]
    fn broken_files_are_refused_not_replaced() {
        assert!(matches!(configure(Some("{\"a\": 1,"), true), Err(MergeError::Invalid(_))));
        assert_eq!(configure(Some("[1, 2]"), true), Err(MergeError::NotAnObject));
        assert_eq!(configure(Some(r#"{"runtimes": []}"#), true), Err(MergeError::RuntimesNotAnObject));
    }

    #[test]
    fn numbers_and_unicode_survive() {
        let t = r#"{"max-concurrent-downloads": 3, "ratio": 0.5, "big": 18446744073709551615, "label": "сервер"}"#;
        let Merged::Changed(out) = configure(Some(t), true).unwrap() else { panic!() };
        assert!(out.contains("18446744073709551615") && out.contains("0.5") && out.contains("сервер"));
    }
}

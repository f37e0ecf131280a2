//! Feeds arbitrary bytes, as the platform receives them, to the serde_json parsers of every
//! request body of the protocol: the agent's `RegisterRequest` and `HeartbeatRequest`, and the
//! admin API's `CreateJoinCodeRequest`, `SetKnownContainersRequest`, `QueueCommandRequest` and
//! `SetProbeImageRequest`. None may panic or hang. A body that parses must serialize again, and
//! the result must parse again; bodies without floats must come back equal (a float may differ
//! in its last bit, as serde_json's default float parser is not correctly rounded).
#![no_main]

use gpum_protocol::{
    CreateJoinCodeRequest, HeartbeatRequest, QueueCommandRequest, RegisterRequest, SetKnownContainersRequest,
    SetProbeImageRequest,
};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Parses `data` as `T`; when it parses, the value survives a round trip.
fn round_trip<T: Serialize + DeserializeOwned>(data: &[u8]) -> Option<(T, T)> {
    let v: T = serde_json::from_slice(data).ok()?;
    let text = serde_json::to_vec(&v).expect("a parsed body serializes");
    let again: T = serde_json::from_slice(&text).expect("a serialized body parses");
    Some((v, again))
}

fn exact<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Some((a, b)) = round_trip::<T>(data) {
        assert_eq!(a, b);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    match sel % 6 {
        // Inventory and metrics carry f32 fields: parse, serialize, parse again.
        0 => drop(round_trip::<RegisterRequest>(body)),
        1 => drop(round_trip::<HeartbeatRequest>(body)),
        2 => exact::<CreateJoinCodeRequest>(body),
        3 => exact::<SetKnownContainersRequest>(body),
        4 => exact::<QueueCommandRequest>(body),
        _ => exact::<SetProbeImageRequest>(body),
    }
});

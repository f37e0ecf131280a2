//! Feeds arbitrary bytes, as the platform receives them, to the serde_json parsers of every
//! request body of the protocol: the agent's `RegisterRequest` and `HeartbeatRequest`, and the
//! admin API's `CreateJoinCodeRequest`, `SetKnownContainersRequest`, `QueueCommandRequest` and
//! `SetProbeImageRequest`. None may panic or hang. A body that parses must serialize again, and
//! the result must parse back to the same value (the platform stores what it accepted as JSON
//! and reads it back). A heartbeat's two `f32` fields may differ in their last bits (serde_json's
//! default float parser is not correctly rounded), so they are compared with a tolerance.
//!
//! Finding F1 (fuzz/README.md), now fixed: a heartbeat whose float was out of `f32` range (`1e47`)
//! parsed to infinity, which serializes as `null` and then does not parse. The protocol refuses
//! such numbers now; a parsed heartbeat with a non-finite float fails this target. The reproducer
//! is `fuzz/findings/protocol_bodies-heartbeat-power_w-overflows-to-inf`.
#![no_main]

use gpum_protocol::{
    CreateJoinCodeRequest, HeartbeatRequest, QueueCommandRequest, RegisterRequest, SetKnownContainersRequest,
    SetProbeImageRequest,
};
use libfuzzer_sys::fuzz_target;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Parses `data` as `T`; when it parses, serializes it and parses that again.
fn round_trip<T: Serialize + DeserializeOwned>(data: &[u8]) -> Option<(T, T)> {
    let v: T = serde_json::from_slice(data).ok()?;
    let text = serde_json::to_vec(&v).expect("a parsed body serializes");
    let again: T = serde_json::from_slice(&text).unwrap_or_else(|e| {
        panic!("a serialized body parses: {e}: {}", String::from_utf8_lossy(&text))
    });
    Some((v, again))
}

fn exact<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Some((a, b)) = round_trip::<T>(data) {
        assert_eq!(a, b);
    }
}

fn close(a: f32, b: f32) -> bool {
    a == b || (a - b).abs() <= f32::EPSILON * 4.0 * a.abs().max(b.abs())
}

/// The heartbeat's floats, in order.
fn floats(h: &HeartbeatRequest) -> Vec<f32> {
    std::iter::once(h.metrics.cpu_load_pct).chain(h.metrics.gpus.iter().map(|g| g.power_w)).collect()
}

fn zero_floats(h: &mut HeartbeatRequest) {
    h.metrics.cpu_load_pct = 0.0;
    h.metrics.gpus.iter_mut().for_each(|g| g.power_w = 0.0);
}

fn heartbeat(data: &[u8]) {
    let Ok(h) = serde_json::from_slice::<HeartbeatRequest>(data) else { return };
    assert!(floats(&h).iter().all(|f| f.is_finite()), "F1: a non-finite float was accepted: {:?}", floats(&h));
    let (mut a, mut b) = round_trip::<HeartbeatRequest>(data).expect("parsed once already");
    let (fa, fb) = (floats(&a), floats(&b));
    assert!(fa.iter().zip(&fb).all(|(x, y)| close(*x, *y)), "{fa:?} != {fb:?}");
    zero_floats(&mut a);
    zero_floats(&mut b);
    assert_eq!(a, b);
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else { return };
    match sel % 6 {
        0 => exact::<RegisterRequest>(body),
        1 => heartbeat(body),
        2 => exact::<CreateJoinCodeRequest>(body),
        3 => exact::<SetKnownContainersRequest>(body),
        4 => exact::<QueueCommandRequest>(body),
        _ => exact::<SetProbeImageRequest>(body),
    }
});

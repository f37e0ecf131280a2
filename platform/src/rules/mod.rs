//! The platform's rules as pure functions: facts and a request in, a plan (the writes and the
//! answer, as data) out; no database, no clock, no I/O. They import only `gpum_protocol` and
//! `std`, so that they can move to the `platform-core` crate as they are (issue 44, item 1).

pub mod heartbeat;

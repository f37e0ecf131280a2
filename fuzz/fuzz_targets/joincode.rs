//! Feeds arbitrary strings to the join-code parser, which reads what an owner pastes (and what
//! the platform receives in a registration). It must never panic; a code it accepts must print
//! in the canonical form, and that form must parse to the same code.
#![no_main]

use gpum_protocol::joincode::JoinCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(code) = JoinCode::parse(text) {
        let shown = code.to_string();
        assert!(shown.starts_with("GPUM-"), "{shown}");
        assert_eq!(shown.len(), "GPUM-7K3QD-M2X9P-4RT8V-H6W1N-Z".len(), "{shown}");
        assert!(JoinCode::parse(&shown).as_ref() == Ok(&code), "{shown} does not parse back");
    }
});

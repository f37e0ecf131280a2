//! Issue 46: a server's GPUs at a glance: how many are rented, how many idle (free on a
//! rentable server) and how many not rentable (free on a server that is not).

use gpum_protocol::Occupancy;

/// The occupancy of a server with the GPUs `gpus` (UUIDs) of which its rentals hold `held`
/// (`rentals::held_gpus`; a held UUID the server no longer lists is not counted), rentable or not.
pub fn occupancy(gpus: &[String], held: &[String], rentable: bool) -> Occupancy {
    let total = gpus.len() as u32;
    let mut rented = 0u32;
    for (i, g) in gpus.iter().enumerate() {
        // A UUID listed twice counts once.
        if held.contains(g) && !gpus[..i].contains(g) {
            rented += 1;
        }
    }
    let free = total - rented;
    if rentable {
        Occupancy { rented, idle: free, not_rentable: 0 }
    } else {
        Occupancy { rented, idle: 0, not_rentable: free }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn examples() {
        let gpus = v(&["a", "b", "c"]);
        assert_eq!(occupancy(&gpus, &v(&["b"]), true), Occupancy { rented: 1, idle: 2, not_rentable: 0 });
        assert_eq!(
            occupancy(&gpus, &v(&["b", "x"]), false),
            Occupancy { rented: 1, idle: 0, not_rentable: 2 }
        );
        assert_eq!(
            occupancy(&gpus, &v(&["a", "b", "c"]), false),
            Occupancy { rented: 3, idle: 0, not_rentable: 0 }
        );
        assert_eq!(occupancy(&[], &v(&["a"]), true), Occupancy { rented: 0, idle: 0, not_rentable: 0 });
    }

    proptest! {
        /// Every GPU is counted once: rented, idle or not rentable; idle only when rentable.
        #[test]
        fn each_gpu_once(gpus in proptest::collection::vec("[a-d]", 0..6), held in proptest::collection::vec("[a-f]", 0..6), rentable: bool) {
            let o = occupancy(&gpus, &held, rentable);
            prop_assert_eq!(o.rented + o.idle + o.not_rentable, gpus.len() as u32);
            prop_assert!(rentable || o.idle == 0);
            prop_assert!(!rentable || o.not_rentable == 0);
            let distinct_held = gpus.iter().enumerate().filter(|(i, g)| held.contains(g) && !gpus[..*i].contains(g)).count();
            prop_assert_eq!(o.rented as usize, distinct_held);
        }
    }
}

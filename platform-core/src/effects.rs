//! Effects as data (issue 44, items 1 and 2): what a change of state ends that lives outside the
//! database (the relay's tunnels and streams), decided here as values.
//!
//! The platform records them in the transaction of the change and every replica applies them
//! to its own relay (`gpum_platform::effects`: the row mapping, the recording, the applier).
//! This module only says *which* effects each operation has: no face and no operation decides
//! that for itself.

/// Something live that a change of state ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Close rental `rental_id`'s open streams (it was stopped or ended).
    EndRental { rental_id: String },
    /// Drop node `node_id`'s tunnel (deleted, or its token replaced).
    EndNode { node_id: String },
}

/// Which effects each operation produces.
pub mod rules {
    use super::Effect;

    /// A rental stopped: its streams close, if the stop changed anything.
    pub fn rental_stopped(rental_id: &str, changed: bool) -> Vec<Effect> {
        if changed { vec![Effect::EndRental { rental_id: rental_id.to_owned() }] } else { vec![] }
    }

    /// Rentals that ended together (their node deleted, their owner disabled): each one's
    /// streams close.
    pub fn rentals_ended(rental_ids: &[String]) -> Vec<Effect> {
        rental_ids.iter().map(|id| Effect::EndRental { rental_id: id.clone() }).collect()
    }

    /// A node deleted: its tunnel goes, and the streams of the rentals that ended with it.
    pub fn node_deleted(node_id: &str, ended_rentals: &[String]) -> Vec<Effect> {
        let mut v = vec![Effect::EndNode { node_id: node_id.to_owned() }];
        v.extend(rentals_ended(ended_rentals));
        v
    }

    /// A node's token replaced: the tunnel its old token opened goes (the new token's holder
    /// opens its own).
    pub fn token_replaced(node_id: &str) -> Vec<Effect> {
        vec![Effect::EndNode { node_id: node_id.to_owned() }]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_rules_say_what_each_operation_ends() {
        assert_eq!(
            rules::rental_stopped("rent-1", true),
            vec![Effect::EndRental { rental_id: "rent-1".into() }]
        );
        assert_eq!(
            rules::rental_stopped("rent-1", false),
            vec![],
            "a stop that changed nothing ends nothing"
        );
        assert_eq!(
            rules::node_deleted("node-1", &["rent-1".into(), "rent-2".into()]),
            vec![
                Effect::EndNode { node_id: "node-1".into() },
                Effect::EndRental { rental_id: "rent-1".into() },
                Effect::EndRental { rental_id: "rent-2".into() },
            ]
        );
        assert_eq!(rules::token_replaced("node-1"), vec![Effect::EndNode { node_id: "node-1".into() }]);
        assert_eq!(rules::rentals_ended(&[]), vec![]);
    }

    proptest! {
        /// A deleted node's tunnel always goes first, then exactly one end per rental that
        /// ended with it, in their order, and nothing else.
        #[test]
        fn a_deleted_node_ends_its_tunnel_and_each_ended_rental_once(
            node in "[a-z0-9-]{1,12}",
            rentals in proptest::collection::vec("[a-z0-9-]{1,12}", 0..8),
        ) {
            let effects = rules::node_deleted(&node, &rentals);
            prop_assert_eq!(effects.len(), rentals.len() + 1);
            prop_assert_eq!(&effects[0], &Effect::EndNode { node_id: node.clone() });
            for (e, r) in effects[1..].iter().zip(&rentals) {
                prop_assert_eq!(e, &Effect::EndRental { rental_id: r.clone() });
            }
        }

        /// Rentals that ended together end their streams one for one, and a stop ends
        /// something exactly when it changed something.
        #[test]
        fn ended_rentals_map_one_for_one(
            rentals in proptest::collection::vec("[a-z0-9-]{1,12}", 0..8),
            changed: bool,
        ) {
            let effects = rules::rentals_ended(&rentals);
            prop_assert_eq!(effects.len(), rentals.len());
            let all_rentals = effects.iter().all(|e| matches!(e, Effect::EndRental { .. }));
            prop_assert!(all_rentals, "only rentals end");
            for r in &rentals {
                prop_assert_eq!(rules::rental_stopped(r, changed).len(), usize::from(changed));
            }
        }
    }
}

//! Shared bits of the examples: the interest-posting demo's ledger.

pub mod ledger;

//! Earnings (issue 46, "Money"): what the rentals on an owner's servers earned, metered from
//! what the agents reported running. Every amount is an integer count of the currency's minor
//! units, with the currency named beside it; docs/protocol.md, "Earnings", is the contract.

use serde::{Deserialize, Serialize};

/// An owner's earnings (bearer: one of their API keys). `?format=csv`: the rentals as CSV.
pub const PATH_OWNER_EARNINGS: &str = "/api/v1/owner/earnings";
/// The operator's view of the same (`?owner=ID`: one owner's; else every owner's, with
/// `owners` filled). `?format=csv` as the owner's.
pub const PATH_ADMIN_EARNINGS: &str = "/api/v1/admin/earnings";

/// A rental's price, fixed when it was created: the server's price per GPU-hour then, in minor
/// units of `currency`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalPrice {
    pub per_gpu_hour: u64,
    /// ISO 4217.
    pub currency: String,
}

/// The currency every amount is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CurrencyInfo {
    /// ISO 4217, e.g. `RUB`.
    pub code: String,
    /// Decimal places of its minor unit (`RUB`: 2; `JPY`: 0).
    pub minor_units: u8,
}

/// Totals of some rentals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct EarningsSum {
    pub rentals: u64,
    /// Billable time: seconds reported running × GPUs.
    pub gpu_seconds: u64,
    /// Minor units.
    pub amount: u64,
}

/// One rental's earnings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RentalEarnings {
    pub id: String,
    pub node_id: String,
    /// The server's name (its host name when it has none; empty once deleted).
    pub server_name: String,
    /// The image's name, without its digest.
    pub image: String,
    pub gpus: u32,
    /// Unix seconds.
    pub created_at: u64,
    /// `pending`, `running`, `exited`, `stopping`, `gone`, `failed`, `stopped`, `expired`…
    /// (the agent's last report, else what the platform knows).
    pub state: String,
    /// `None` for a rental created before prices were fixed on rentals, when the server had none.
    pub price_per_gpu_hour: Option<u64>,
    pub gpu_seconds: u64,
    /// Minor units.
    pub amount: u64,
}

/// One server's, day's, month's or owner's totals.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EarningsLine {
    /// A node id, `YYYY-MM-DD` (UTC), `YYYY-MM` (UTC) or an owner id.
    pub key: String,
    /// A server's name, an owner's e-mail; empty for days and months.
    #[serde(default)]
    pub label: String,
    #[serde(flatten)]
    pub sum: EarningsSum,
}

/// `GET /api/v1/owner/earnings`, `GET /api/v1/admin/earnings`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Earnings {
    pub currency: CurrencyInfo,
    /// Unix seconds the figures were computed at (a running rental's time counts up to its
    /// node's last heartbeat).
    pub at: u64,
    pub total: EarningsSum,
    /// Newest first.
    pub rentals: Vec<RentalEarnings>,
    pub servers: Vec<EarningsLine>,
    /// Oldest first.
    pub days: Vec<EarningsLine>,
    pub months: Vec<EarningsLine>,
    /// Only in the operator's view of every owner: each owner's totals (rentals on servers with
    /// no owner under the key `""`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owners: Vec<EarningsLine>,
}

//! The one error type of the platform: a stable [`ErrorCode`] plus a message, turned into the
//! `{"error":{"code","message"}}` body with the code's HTTP status.
//!
//! Database failures become `internal` (500) with a generic message; the details go to the
//! server's log only, so a client never learns about the schema.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use gpum_protocol::{ErrorBody, ErrorCode, ErrorDetail};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError { code, message: message.into() }
    }

    pub fn internal() -> Self {
        ApiError::new(ErrorCode::Internal, "internal error; try again later")
    }

    pub fn not_found(what: &str) -> Self {
        ApiError::new(ErrorCode::NotFound, format!("{what} not found"))
    }

    pub fn body(&self) -> ErrorBody {
        ErrorBody { error: ErrorDetail { code: self.code, message: self.message.clone() } }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = serde_json::to_value(self.code)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        write!(f, "{code}: {}", self.message)
    }
}

impl std::error::Error for ApiError {}

impl From<rusqlite::Error> for ApiError {
    fn from(e: rusqlite::Error) -> Self {
        tracing::error!("database: {e}");
        ApiError::internal()
    }
}

impl From<crate::sql::Error> for ApiError {
    fn from(e: crate::sql::Error) -> Self {
        if let crate::sql::Error::Nul = e {
            return ApiError::new(ErrorCode::InvalidRequest, "text must not hold a NUL character");
        }
        tracing::error!("database: {}", e.detail());
        ApiError::internal()
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        tracing::error!("stored JSON: {e}");
        ApiError::internal()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

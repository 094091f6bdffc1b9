//! The web chat page at `GET /`: one static page embedded in the binary (`chat_page.html`)
//! that streams answers from `/v1/chat/completions`, with a system prompt, sampling settings,
//! a stop button, and its own small Markdown and code renderer (no outside resources).

use axum::response::{Html, IntoResponse, Response};

/// The page's HTML.
pub const CHAT_PAGE: &str = include_str!("chat_page.html");

/// `GET /`.
pub async fn chat_page() -> Response {
    (
        [
            ("cache-control", "no-cache"),
            ("x-content-type-options", "nosniff"),
        ],
        Html(CHAT_PAGE),
    )
        .into_response()
}

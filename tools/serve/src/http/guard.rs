//! What every endpoint shares before and after its handler: the API key check (constant time),
//! CORS for one configured origin, the body size limit (refused from `Content-Length` before
//! any of the body is read), and the OpenAI error shape for errors axum answers itself (unknown
//! path, wrong method, body over the limit).

use super::{ApiError, AppState};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// Largest request body accepted (bytes).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// Checks a `--cors-origin` value: `*` or `scheme://host[:port]`.
pub fn check_cors_origin(o: &str) -> Result<(), String> {
    if o == "*" {
        return Ok(());
    }
    let rest = o
        .strip_prefix("http://")
        .or_else(|| o.strip_prefix("https://"));
    match rest {
        Some(h)
            if !h.is_empty()
                && !h.contains('/')
                && h.bytes().all(|b| b.is_ascii_graphic())
                && HeaderValue::from_str(o).is_ok() =>
        {
            Ok(())
        }
        _ => Err(format!(
            "--cors-origin must be * or scheme://host[:port] (like http://localhost:3000), got '{o}'"
        )),
    }
}

/// True when `given` equals `want`; the time taken depends only on `want`'s length.
pub fn same_key(given: &[u8], want: &[u8]) -> bool {
    let mut diff = given.len() ^ want.len();
    for (i, w) in want.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!w);
        diff |= usize::from(g ^ w);
    }
    std::hint::black_box(diff) == 0
}

/// Refuses a request without the configured `Authorization: Bearer KEY`.
pub fn auth(st: &AppState, h: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.api_key else {
        return Ok(());
    };
    let given = h
        .get(header::AUTHORIZATION)
        .map(|v| v.as_bytes())
        .and_then(|v| v.strip_prefix(b"Bearer "))
        .unwrap_or(b"");
    if same_key(given, key.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key (Authorization: Bearer ...)".into(),
        ))
    }
}

fn too_large() -> ApiError {
    ApiError(
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than the limit of {MAX_BODY_BYTES} bytes"),
    )
}

/// Refuses a body whose announced length is over [`MAX_BODY_BYTES`] without reading it (a
/// client that sent `Expect: 100-continue` then never sends it); longer bodies without a
/// length are cut by the limit on reading.
pub async fn length_limit(req: Request, next: Next) -> Response {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large().into_response();
    }
    next.run(req).await
}

/// Rewrites error responses that are not JSON (axum's own 404/405/413 and rejections) into the
/// OpenAI error shape, keeping their status and `Allow` header.
pub async fn json_errors(req: Request, next: Next) -> Response {
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    let resp = next.run(req).await;
    let st = resp.status();
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(st.is_client_error() || st.is_server_error()) || json {
        return resp;
    }
    let allow = resp.headers().get(header::ALLOW).cloned();
    let body = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_string())
        .unwrap_or_default();
    let msg = match st {
        StatusCode::METHOD_NOT_ALLOWED => match &allow {
            Some(a) => format!(
                "method {method} is not allowed on {path} (allowed: {})",
                a.to_str().unwrap_or("")
            ),
            None => format!("method {method} is not allowed on {path}"),
        },
        StatusCode::PAYLOAD_TOO_LARGE => too_large().1,
        _ if !body.is_empty() => body,
        _ => st.canonical_reason().unwrap_or("error").to_string(),
    };
    let mut r = ApiError(st, msg).into_response();
    if let Some(a) = allow {
        r.headers_mut().insert(header::ALLOW, a);
    }
    r
}

/// CORS for the configured origin: answers preflight requests and adds
/// `Access-Control-Allow-Origin` to responses of an allowed origin.
pub async fn cors(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(allowed) = st.cors_origin.as_deref() else {
        return next.run(req).await;
    };
    let origin = req.headers().get(header::ORIGIN).cloned();
    let ok = origin
        .as_ref()
        .is_some_and(|o| allowed == "*" || o.as_bytes() == allowed.as_bytes());
    let preflight = req.method() == Method::OPTIONS
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
    let value = if allowed == "*" {
        HeaderValue::from_static("*")
    } else {
        origin.unwrap_or(HeaderValue::from_static("null"))
    };
    if preflight {
        if !ok {
            return ApiError(
                StatusCode::FORBIDDEN,
                format!("origin not allowed (this server allows {allowed})"),
            )
            .into_response();
        }
        let mut r = StatusCode::NO_CONTENT.into_response();
        let h = r.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static("authorization, content-type"),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, HeaderValue::from_static("origin"));
        return r;
    }
    let mut r = next.run(req).await;
    if ok {
        r.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        r.headers_mut()
            .insert(header::VARY, HeaderValue::from_static("origin"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_compare_equal_only_when_equal() {
        assert!(same_key(b"sekret", b"sekret"));
        assert!(!same_key(b"sekreT", b"sekret"));
        assert!(!same_key(b"sekret!", b"sekret"));
        assert!(!same_key(b"sekre", b"sekret"));
        assert!(!same_key(b"", b"sekret"));
        assert!(same_key(b"", b""));
    }
}

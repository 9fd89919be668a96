//! Rejections as gRPC statuses. A request whose content type is `application/grpc…` is answered
//! trailers-only (HTTP 200, `grpc-status`, `grpc-message`, no body), never with an HTTP error
//! body that a gRPC client can't read. No gRPC library is needed for that: the few bytes of
//! `google.rpc.Status` the answer carries are written here.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use dlock_core::{ErrorResponses, LockError};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use http_body::Frame;

use crate::body::LockBody;
use crate::rejection::LockRejection;

/// Which gRPC protocol a request speaks, and so the content type of the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Grpc {
    /// `application/grpc`, `application/grpc+proto`, …
    Http2,
    /// `application/grpc-web`, `application/grpc-web+proto`, …
    Web,
    /// `application/grpc-web-text`, `application/grpc-web-text+proto`, …
    WebText,
}

impl Grpc {
    /// The protocol of a request with these headers, if it is a gRPC one.
    pub(crate) fn of(headers: &HeaderMap) -> Option<Self> {
        // Asked of every request: no allocation.
        let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        let media = value.split(';').next().unwrap_or_default().trim();
        let base = media.split_once('+').map_or(media, |(base, _)| base);
        [
            ("application/grpc", Self::Http2),
            ("application/grpc-web", Self::Web),
            ("application/grpc-web-text", Self::WebText),
        ]
        .into_iter()
        .find_map(|(media_type, grpc)| base.eq_ignore_ascii_case(media_type).then_some(grpc))
    }

    fn content_type(self) -> HeaderValue {
        HeaderValue::from_static(match self {
            Self::Http2 => "application/grpc",
            Self::Web => "application/grpc-web",
            Self::WebText => "application/grpc-web-text",
        })
    }
}

/// gRPC status codes (`google.rpc.Code`).
const INVALID_ARGUMENT: u8 = 3;
const ABORTED: u8 = 10;
const INTERNAL: u8 = 13;
const UNAVAILABLE: u8 = 14;

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");
const GRPC_MESSAGE: HeaderName = HeaderName::from_static("grpc-message");
const GRPC_STATUS_DETAILS: HeaderName = HeaderName::from_static("grpc-status-details-bin");
const GRPC_RETRY_PUSHBACK: HeaderName = HeaderName::from_static("grpc-retry-pushback-ms");

/// The gRPC status of `rejection`: busy and lost are `ABORTED`, an unavailable backend
/// `UNAVAILABLE`, an invalid key `INVALID_ARGUMENT`, anything else `INTERNAL`; and a message
/// that never holds the backend's error, naming the lock unless `hide_names`.
fn status(rejection: &LockRejection, hide_names: bool) -> (u8, String) {
    let (code, message) = match rejection {
        LockRejection::Busy { .. } => (ABORTED, "another request holds this lock; retry later"),
        LockRejection::Lost { .. } => (
            ABORTED,
            "the lock was lost while the request ran; the request was cancelled",
        ),
        LockRejection::Unavailable(_) => (
            UNAVAILABLE,
            "the lock service could not be reached; retry later",
        ),
        LockRejection::InvalidKey(_) => (INVALID_ARGUMENT, "invalid lock name"),
        LockRejection::Internal(_) => (INTERNAL, "the lock could not be taken"),
    };
    let mut message = message.to_owned();
    if let LockRejection::InvalidKey(LockError::InvalidName(invalid)) = rejection {
        // Why (length, a control character's offset), never the name itself.
        let _ = write!(message, ": {invalid}");
    }
    if let (Some(name), false) = (rejection.name(), hide_names) {
        let _ = write!(message, " (lock `{name}`)");
    }
    (code, message)
}

/// Writes `grpc-status` and `grpc-message` into `headers`.
fn insert_status(headers: &mut HeaderMap, code: u8, message: &str) {
    headers.insert(GRPC_STATUS, HeaderValue::from(u16::from(code)));
    if let Ok(value) = HeaderValue::try_from(percent_encode(message)) {
        headers.insert(GRPC_MESSAGE, value);
    }
}

/// The trailers-only answer to `rejection` (see [`status`]); for a busy lock, when to retry
/// ([`ErrorResponses::retry_delay`]) as `grpc-retry-pushback-ms`, `retry-after` and a
/// `google.rpc.RetryInfo` detail.
pub(crate) fn response(
    rejection: &LockRejection,
    responses: &ErrorResponses,
    grpc: Grpc,
) -> http::Response<LockBody<()>> {
    let (code, message) = status(rejection, responses.names_hidden());
    let mut response = http::Response::new(LockBody::empty());
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, grpc.content_type());
    insert_status(headers, code, &message);
    if let LockRejection::Busy { retry_after, .. } = rejection {
        let delay = responses.retry_delay(*retry_after);
        let millis = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        headers.insert(GRPC_RETRY_PUSHBACK, HeaderValue::from(millis));
        let secs = responses.retry_after_secs(*retry_after);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        let details = retry_status(code, &message, delay);
        if let Ok(value) = HeaderValue::try_from(base64(&details)) {
            headers.insert(GRPC_STATUS_DETAILS, value);
        }
    }
    response
}

/// The last frame of a response body that `rejection` ends mid-stream (see [`status`]): the
/// trailers for gRPC over HTTP/2, a trailer frame in the body for gRPC-Web (base64 for
/// `grpc-web-text`), since its trailers travel in the body.
pub(crate) fn trailers(rejection: &LockRejection, hide_names: bool, grpc: Grpc) -> Frame<Bytes> {
    let (code, message) = status(rejection, hide_names);
    let mut trailers = HeaderMap::new();
    insert_status(&mut trailers, code, &message);
    if grpc == Grpc::Http2 {
        return Frame::trailers(trailers);
    }
    // gRPC-Web: a frame flagged 0x80, its length, then the trailers as `name:value\r\n` lines.
    let mut block = Vec::new();
    for (name, value) in &trailers {
        block.extend_from_slice(name.as_str().as_bytes());
        block.push(b':');
        block.extend_from_slice(value.as_bytes());
        block.extend_from_slice(b"\r\n");
    }
    let mut frame = vec![0x80];
    frame.extend_from_slice(&u32::try_from(block.len()).unwrap_or(u32::MAX).to_be_bytes());
    frame.extend_from_slice(&block);
    if grpc == Grpc::WebText {
        let mut text = base64(&frame);
        while !text.len().is_multiple_of(4) {
            text.push('=');
        }
        return Frame::data(Bytes::from(text));
    }
    Frame::data(Bytes::from(frame))
}

/// What `grpc-message` escapes as `%XX` (UTF-8): bytes outside `0x20..=0x7E`, and `%`.
const GRPC_MESSAGE_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');

/// `grpc-message` encoding, as the gRPC HTTP/2 protocol gives it.
fn percent_encode(message: &str) -> String {
    percent_encoding::utf8_percent_encode(message, GRPC_MESSAGE_ESCAPED).to_string()
}

/// A `google.rpc.Status` with `code`, `message` and one detail, a `google.rpc.RetryInfo` of
/// `delay`: the value of `grpc-status-details-bin`, before base64.
fn retry_status(code: u8, message: &str, delay: Duration) -> Vec<u8> {
    // google.protobuf.Duration { int64 seconds = 1; int32 nanos = 2; }
    let mut duration = Vec::new();
    let seconds = delay.as_secs().min(i64::MAX as u64);
    if seconds != 0 {
        varint_field(&mut duration, 1, seconds);
    }
    if delay.subsec_nanos() != 0 {
        varint_field(&mut duration, 2, u64::from(delay.subsec_nanos()));
    }
    // google.rpc.RetryInfo { google.protobuf.Duration retry_delay = 1; }
    let mut retry_info = Vec::new();
    bytes_field(&mut retry_info, 1, &duration);
    // google.protobuf.Any { string type_url = 1; bytes value = 2; }
    let mut any = Vec::new();
    bytes_field(&mut any, 1, b"type.googleapis.com/google.rpc.RetryInfo");
    bytes_field(&mut any, 2, &retry_info);
    // google.rpc.Status { int32 code = 1; string message = 2; repeated google.protobuf.Any details = 3; }
    let mut status = Vec::new();
    varint_field(&mut status, 1, u64::from(code));
    bytes_field(&mut status, 2, message.as_bytes());
    bytes_field(&mut status, 3, &any);
    status
}

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A field of wire type 0 (varint).
fn varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    varint(out, field << 3);
    varint(out, value);
}

/// A field of wire type 2 (length-delimited).
fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, (field << 3) | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// Standard base64 without padding, as gRPC sends binary (`-bin`) metadata.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let byte = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let triple = (byte(0) << 16) | (byte(1) << 8) | byte(2);
        for i in 0..=chunk.len() {
            let sextet = (triple >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(ALPHABET[sextet as usize]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grpc(content_type: &str) -> Option<Grpc> {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_str(content_type).unwrap_or_else(|e| panic!("{e}")),
        );
        Grpc::of(&headers)
    }

    #[test]
    fn grpc_requests_are_told_by_their_content_type() {
        assert_eq!(grpc("application/grpc"), Some(Grpc::Http2));
        assert_eq!(grpc("application/grpc+proto"), Some(Grpc::Http2));
        assert_eq!(grpc("Application/GRPC; charset=utf-8"), Some(Grpc::Http2));
        assert_eq!(grpc("application/grpc-web+proto"), Some(Grpc::Web));
        assert_eq!(grpc("application/grpc-web-text"), Some(Grpc::WebText));
        assert_eq!(grpc("application/grpcx"), None);
        assert_eq!(grpc("application/json"), None);
        assert_eq!(Grpc::of(&HeaderMap::new()), None);
    }

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("busy (lock `a:b`)"), "busy (lock `a:b`)");
        assert_eq!(percent_encode("100% é\n"), "100%25 %C3%A9%0A");
        assert_eq!(percent_encode("~\u{7f}"), "~%7F");
    }

    #[test]
    fn a_lost_lock_ends_the_stream_with_aborted_trailers() {
        let lost = LockRejection::Lost {
            name: "order:7".into(),
            fencing_token: Some(dlock_core::FencingToken::new(3)),
        };
        let frame = trailers(&lost, false, Grpc::Http2);
        let headers = frame
            .trailers_ref()
            .unwrap_or_else(|| panic!("no trailers"));
        assert_eq!(headers[GRPC_STATUS], "10");
        assert_eq!(
            headers[GRPC_MESSAGE],
            "the lock was lost while the request ran; the request was cancelled (lock `order:7`)"
        );
        let hidden = trailers(&lost, true, Grpc::Http2);
        let headers = hidden
            .trailers_ref()
            .unwrap_or_else(|| panic!("no trailers"));
        assert!(
            !headers[GRPC_MESSAGE]
                .to_str()
                .unwrap_or("order")
                .contains("order")
        );

        let web = trailers(&lost, true, Grpc::Web)
            .into_data()
            .unwrap_or_default();
        let block = b"grpc-status:10\r\ngrpc-message:the lock was lost while the request ran; \
                      the request was cancelled\r\n";
        assert_eq!(web[0], 0x80);
        assert_eq!(&web[1..5], &(block.len() as u32).to_be_bytes());
        assert_eq!(&web[5..], block);
        let text = trailers(&lost, true, Grpc::WebText)
            .into_data()
            .unwrap_or_default();
        assert_eq!(text.len() % 4, 0);
        assert!(text.starts_with(b"gAAAA"), "{text:?}");
    }

    #[test]
    fn base64_has_no_padding() {
        let cases = [
            ("", ""),
            ("f", "Zg"),
            ("fo", "Zm8"),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg"),
            ("fooba", "Zm9vYmE"),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, encoded) in cases {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
        assert_eq!(base64(&[0xfb, 0xff]), "+/8");
    }

    #[test]
    fn the_status_detail_is_protobuf() {
        let bytes = retry_status(10, "m", Duration::from_millis(2_500));
        let mut expected = vec![0x08, 10, 0x12, 1, b'm', 0x1a];
        let type_url = b"type.googleapis.com/google.rpc.RetryInfo";
        // Duration { seconds: 2, nanos: 500_000_000 } = 08 02 10 80 CA B5 EE 01
        let duration = [0x08, 0x02, 0x10, 0x80, 0xca, 0xb5, 0xee, 0x01];
        let any_len = 2 + type_url.len() + 2 + 2 + duration.len();
        expected.push(any_len as u8);
        expected.extend([0x0a, type_url.len() as u8]);
        expected.extend(type_url);
        expected.extend([0x12, 2 + duration.len() as u8, 0x0a, duration.len() as u8]);
        expected.extend(duration);
        assert_eq!(bytes, expected);
    }
}

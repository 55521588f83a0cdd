//! The client against a canned HTTP server on 127.0.0.1 (a port the test picks): each test
//! writes the exact bytes a server would, split into several writes.

use std::time::Duration;

use abserve_protocol::wire::{ChatRequest, Common};
use abserve_protocol::{Client, ClientError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Serves one connection: reads the request head and body, then writes `parts` with a pause
/// between them, then closes.
async fn canned(parts: Vec<Vec<u8>>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = Vec::new();
        // read until the body announced by content-length has arrived
        loop {
            let n = s.read(&mut buf).await.unwrap();
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).to_string();
            if let Some(end) = text.find("\r\n\r\n") {
                let len = text
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().parse::<usize>().unwrap())
                    })
                    .unwrap_or(0);
                if got.len() >= end + 4 + len {
                    break;
                }
            }
            if n == 0 {
                break;
            }
        }
        for p in parts {
            s.write_all(&p).await.unwrap();
            s.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    });
    format!("http://{addr}/v1")
}

fn sse_head() -> Vec<u8> {
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n".to_vec()
}

fn client(url: &str) -> Client {
    Client::new(url, Some("k".into()), Duration::from_secs(10)).unwrap()
}

#[tokio::test]
async fn a_stream_split_anywhere_gives_text_usage_and_timing() {
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        ": ping\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo é\"},\"finish_reason\":null}]}\r\n\r\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
        "data: [DONE]\n\n"
    )
    .as_bytes();
    let mut parts = vec![sse_head()];
    parts.extend(body.chunks(37).map(|c| c.to_vec()));
    let url = canned(parts).await;
    let out = client(&url)
        .chat(
            ChatRequest {
                common: Common {
                    model: Some("m".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            true,
        )
        .await
        .unwrap();
    assert_eq!(out.text, "Hello é");
    assert_eq!(out.finish_reason.as_deref(), Some("stop"));
    assert_eq!(out.usage.unwrap().completion_tokens, 2);
    assert!(out.timing.ttft.is_some());
    assert_eq!(out.timing.gaps.len(), 1, "two content chunks: one gap");
}

#[tokio::test]
async fn bad_json_error_chunks_and_cut_streams_are_errors() {
    let bad = canned(vec![
        sse_head(),
        b"data: {not json\n\n".to_vec(),
        b"data: [DONE]\n\n".to_vec(),
    ])
    .await;
    let e = client(&bad)
        .chat(ChatRequest::default(), true)
        .await
        .unwrap_err();
    assert!(matches!(e, ClientError::BadChunk(_)), "{e:?}");

    let oom = canned(vec![
        sse_head(),
        b"data: {\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}\n\n".to_vec(),
    ])
    .await;
    let e = client(&oom)
        .chat(ChatRequest::default(), true)
        .await
        .unwrap_err();
    assert_eq!(e, ClientError::ServerError("out of memory".into()));

    let cut = canned(vec![
        sse_head(),
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n".to_vec(),
    ])
    .await;
    let e = client(&cut)
        .chat(ChatRequest::default(), true)
        .await
        .unwrap_err();
    assert_eq!(e, ClientError::Incomplete);
}

#[tokio::test]
async fn status_errors_carry_retry_after_and_the_openai_message() {
    let body = r#"{"error":{"message":"the queue is full","type":"rate_limit_error","param":null,"code":null}}"#;
    let head = format!("HTTP/1.1 429 Too Many Requests\r\nretry-after: 2\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    let url = canned(vec![head.into_bytes(), body.as_bytes().to_vec()]).await;
    let e = client(&url)
        .chat(ChatRequest::default(), false)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        ClientError::Status {
            status: 429,
            retry_after: Some(Duration::from_secs(2)),
            message: "the queue is full".into()
        }
    );
}

#[tokio::test]
async fn whole_answers_and_model_discovery() {
    let body = r#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}"#;
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", body.len());
    let url = canned(vec![head.into_bytes(), body.as_bytes().to_vec()]).await;
    let out = client(&url)
        .chat(ChatRequest::default(), false)
        .await
        .unwrap();
    assert_eq!(
        (out.text.as_str(), out.finish_reason.as_deref()),
        ("ok", Some("length"))
    );

    let models = r#"{"object":"list","data":[{"id":"smol","object":"model"}]}"#;
    let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n", models.len());
    let url = canned(vec![head.into_bytes(), models.as_bytes().to_vec()]).await;
    assert_eq!(client(&url).first_model().await.unwrap(), "smol");
}

//! HTTP backends for health-check tests and benchmarks: each answers 200, answers 500 once
//! told to, or accepts connections and never answers (a gray failure), from the start or once
//! told to.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What a test backend does with a connection.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    Ok,
    /// 500 once `failing` is set.
    FailsLater,
    /// Accepts and never answers (a gray failure).
    Hangs,
    /// As `Hangs` once `switch` is set.
    HangsLater,
}

/// One HTTP backend at `address:port` (the port `0` picks one); returns the port. `switch`
/// turns `FailsLater` and `HangsLater` on.
pub async fn backend(address: IpAddr, port: u16, behaviour: Behaviour, switch: Arc<AtomicBool>) -> anyhow::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind((address, port)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let switch = switch.clone();
            tokio::spawn(async move {
                let mut request = [0u8; 1024];
                let on = switch.load(Ordering::SeqCst);
                if behaviour == Behaviour::Hangs || (behaviour == Behaviour::HangsLater && on) {
                    // Read, never answer; the connection goes when the prober gives up.
                    while matches!(stream.read(&mut request).await, Ok(n) if n > 0) {}
                    return;
                }
                let _ = stream.read(&mut request).await;
                let status = if behaviour == Behaviour::FailsLater && on { "500 Oops" } else { "200 OK" };
                let _ = stream.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok").as_bytes()).await;
            });
        }
    });
    Ok(port)
}

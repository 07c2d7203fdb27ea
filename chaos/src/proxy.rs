//! A TCP fault proxy between daemons and the control API: passes, delays, or partitions
//! (new connections are held without an answer, open ones are cut), switchable at any time.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Pass,
    /// Pass, after this extra delay per connection.
    Delay(Duration),
    /// Hold new connections without an answer and cut open ones.
    Partition,
}

pub struct Proxy {
    pub addr: SocketAddr,
    mode: watch::Sender<Mode>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, modes) = watch::channel(Mode::Pass);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(relay(client, upstream, modes.clone()));
            }
        });
        Ok(Proxy { addr, mode, task })
    }

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(mut client: TcpStream, upstream: SocketAddr, mut modes: watch::Receiver<Mode>) {
    let mode = *modes.borrow_and_update();
    match mode {
        Mode::Partition => {
            // Held: nothing passes; the connection is dropped once the partition heals, and
            // the client's retry gets through.
            let _ = modes.changed().await;
            return;
        }
        Mode::Delay(d) => tokio::time::sleep(d).await,
        Mode::Pass => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // A partition cuts open connections; other mode changes leave them be.
        _ = modes.wait_for(|m| *m == Mode::Partition) => {}
    }
}

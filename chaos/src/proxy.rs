//! A TCP fault proxy between daemons and the control API: passes, delays, partitions (new
//! connections held without an answer), resets, or lets requests through one way only;
//! switchable at any time, cutting open connections when the network breaks.

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
    /// Refuse: close new connections at once (a reset) and cut open ones.
    Reset,
    /// One way: requests reach the control API, its answers never come back (the write may
    /// have happened; the caller cannot know). Open connections are cut.
    OneWay,
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

fn breaks(m: &Mode) -> bool {
    matches!(m, Mode::Partition | Mode::Reset | Mode::OneWay)
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
        Mode::Reset => return,
        Mode::OneWay => {
            let Ok(server) = TcpStream::connect(upstream).await else { return };
            let (mut client_read, _client_write) = client.into_split();
            let (mut server_read, mut server_write) = server.into_split();
            let mut sink = tokio::io::sink();
            tokio::select! {
                _ = tokio::io::copy(&mut client_read, &mut server_write) => {}
                _ = tokio::io::copy(&mut server_read, &mut sink) => {}
                _ = modes.wait_for(|m| *m != Mode::OneWay) => {}
            }
            return;
        }
        Mode::Delay(d) => tokio::time::sleep(d).await,
        Mode::Pass => {}
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else { return };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        // A breaking fault cuts open connections; a delay leaves them be.
        _ = modes.wait_for(breaks) => {}
    }
}

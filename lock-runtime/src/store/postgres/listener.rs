//! The runtime's one `LISTEN`ing connection: notifications of the table's release channel
//! become wake-ups in the hub; when the connection breaks it is re-opened with a growing
//! pause, and once it listens again every waiter is woken, since releases may have passed
//! unseen meanwhile.

use std::future::poll_fn;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client};

use super::tls::Endpoint;

use super::ReleaseHub;

/// The listening task of one store; it ends when the store drops.
pub(super) struct Listener {
    hub: Arc<ReleaseHub>,
    live: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Opens the connection and listens; returns once the server confirmed `LISTEN`, or the
    /// first failure.
    pub(super) async fn start(
        endpoint: Endpoint,
        channel: String,
        connect_timeout: Duration,
    ) -> Result<Self, tokio_postgres::Error> {
        let hub = Arc::new(ReleaseHub::new());
        let (live_tx, live) = watch::channel(false);
        let first = listen(&endpoint, &channel, &hub, &live_tx).await?;
        let task = tokio::spawn(run(
            endpoint,
            channel,
            hub.clone(),
            live_tx,
            first,
            connect_timeout,
        ));
        Ok(Listener { hub, live, task })
    }

    pub(super) fn hub(&self) -> &Arc<ReleaseHub> {
        &self.hub
    }

    /// True once the connection listens, waiting for it up to `within`.
    pub(super) async fn wait_live(&self, within: Duration) -> bool {
        let mut live = self.live.clone();
        matches!(
            tokio::time::timeout(within, live.wait_for(|l| *l)).await,
            Ok(Ok(_))
        )
    }
}

/// A listening connection: its client (dropping it would close the connection) and the task
/// that drives it, which ends when the connection does.
struct Listening {
    _client: Client,
    driver: JoinHandle<()>,
}

/// Opens a connection, starts driving it (notifications to the hub) and issues `LISTEN`.
async fn listen(
    endpoint: &Endpoint,
    channel: &str,
    hub: &Arc<ReleaseHub>,
    live: &watch::Sender<bool>,
) -> Result<Listening, tokio_postgres::Error> {
    let (client, mut connection) = endpoint.connect().await?;
    let fan_out = hub.clone();
    let driver = tokio::spawn(async move {
        while let Some(message) = poll_fn(|cx| connection.poll_message(cx)).await {
            match message {
                Ok(AsyncMessage::Notification(n)) => fan_out.notify(n.payload()),
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(error = %e, "PostgreSQL listening connection failed");
                    break;
                }
            }
        }
    });
    // The channel name is checked (lower-case letters, digits, `_`) when the store is built.
    match client.batch_execute(&format!("LISTEN {channel}")).await {
        Ok(()) => {
            live.send_replace(true);
            Ok(Listening {
                _client: client,
                driver,
            })
        }
        Err(e) => {
            driver.abort();
            Err(e)
        }
    }
}

async fn run(
    endpoint: Endpoint,
    channel: String,
    hub: Arc<ReleaseHub>,
    live: watch::Sender<bool>,
    mut current: Listening,
    connect_timeout: Duration,
) {
    let mut pause = Duration::from_millis(50);
    loop {
        // Ends when the connection does (server restart, terminated backend, network).
        let _ = (&mut current.driver).await;
        live.send_replace(false);
        loop {
            tokio::time::sleep(pause).await;
            match tokio::time::timeout(connect_timeout, listen(&endpoint, &channel, &hub, &live))
                .await
            {
                Ok(Ok(next)) => {
                    current = next;
                    pause = Duration::from_millis(50);
                    hub.notify_all();
                    break;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "cannot LISTEN for releases yet"),
                Err(_) => tracing::debug!("cannot LISTEN for releases yet: connect timed out"),
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }
}

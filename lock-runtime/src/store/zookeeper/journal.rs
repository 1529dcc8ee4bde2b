//! The run journal on ZooKeeper: one node per run, `/distributed-locks/runs/<ns>/<job>/r-<seq>`,
//! a sequential TTL node (its sequence orders the runs; its TTL, the age bound, lets the
//! servers remove it), holding `<until_ms> <entry>`: until when it is kept, on the server's
//! clock, so a read leaves out what has aged even before the servers' sweep removes it. The
//! namespace and job nodes are containers: the servers remove them once their last child has
//! gone. Each append then deletes the oldest runs beyond the count bound.

use std::time::Duration;

use zookeeper_client::{CreateMode, Error};

use super::record::node_name;
use super::session::BASE;
use super::{ZooKeeperBackend, ms};
use crate::LockError;
use crate::store::Retention;

fn namespace_dir(namespace: &str) -> String {
    format!("{BASE}/runs/{}", node_name(namespace))
}

fn job_dir(namespace: &str, job: &str) -> String {
    format!("{}/{}", namespace_dir(namespace), node_name(job))
}

/// The sequence of a run node's name (`r-0000000042`).
fn sequence(name: &str) -> Option<i64> {
    name.strip_prefix("r-")?.parse().ok()
}

impl ZooKeeperBackend {
    pub(super) async fn append_run_node(
        &self,
        namespace: &str,
        job: &str,
        entry: &str,
        keep: &Retention,
    ) -> Result<(), LockError> {
        let client = self.session.client();
        let dir = job_dir(namespace, job);
        let max_age = keep.max_age.max(Duration::from_secs(1));
        let until = match self.session.server_now_at_most() {
            Some(now) => now,
            None => self.session.server_now().await?,
        }
        .saturating_add(ms(max_age));
        let value = format!("{until} {entry}");
        let run = self
            .session
            .create_options(CreateMode::PersistentSequential)
            .with_ttl(max_age);
        let container = self.session.create_options(CreateMode::Container);
        let context = format!("appending to the journal of `{job}` failed");
        let mut made = false;
        for _ in 0..3 {
            match client
                .create(&format!("{dir}/r-"), value.as_bytes(), &run)
                .await
            {
                Ok(_) => {
                    made = true;
                    break;
                }
                // The job's container (or its namespace's) is not there (yet, or any more:
                // the servers remove an empty one).
                Err(Error::NoNode) => {
                    for path in [namespace_dir(namespace), dir.clone()] {
                        match client.create(&path, b"", &container).await {
                            Ok(_) | Err(Error::NodeExists) => {}
                            Err(e) => return Err(self.error(&context, e, &client)),
                        }
                    }
                }
                Err(e) => return Err(self.error(&context, e, &client)),
            }
        }
        if !made {
            return Err(crate::BackendError::transient(format!(
                "{context}: its directory kept disappearing"
            ))
            .into());
        }
        // The count bound: the newest `max_runs` stay.
        let mut runs = self.run_names(&client, &dir).await?;
        let max_runs = keep.max_runs.max(1);
        if runs.len() > max_runs {
            runs.truncate(runs.len() - max_runs);
            for (name, _) in runs {
                match client.delete(&format!("{dir}/{name}"), None).await {
                    Ok(()) | Err(Error::NoNode) => {}
                    Err(e) => return Err(self.error(&context, e, &client)),
                }
            }
        }
        Ok(())
    }

    /// The run nodes of `dir`, oldest first; none when there is no such journal.
    async fn run_names(
        &self,
        client: &zookeeper_client::Client,
        dir: &str,
    ) -> Result<Vec<(String, i64)>, LockError> {
        let names = match client.list_children(dir).await {
            Ok(names) => names,
            Err(Error::NoNode) => return Ok(Vec::new()),
            Err(e) => {
                return Err(self.error(&format!("listing `{dir}` failed"), e, client));
            }
        };
        let mut runs: Vec<(String, i64)> = names
            .into_iter()
            .filter_map(|name| sequence(&name).map(|seq| (name, seq)))
            .collect();
        runs.sort_by_key(|(_, seq)| *seq);
        Ok(runs)
    }

    pub(super) async fn run_nodes(
        &self,
        namespace: &str,
        job: &str,
        limit: usize,
    ) -> Result<Vec<String>, LockError> {
        let client = self.session.client();
        let dir = job_dir(namespace, job);
        let runs = self.run_names(&client, &dir).await?;
        let mut found = Vec::new();
        for (name, _) in runs.iter().rev() {
            if found.len() >= limit {
                break;
            }
            let path = format!("{dir}/{name}");
            let value = match client.get_data(&path).await {
                Ok((value, _)) => value,
                Err(Error::NoNode) => continue,
                Err(e) => return Err(self.error(&format!("reading `{path}` failed"), e, &client)),
            };
            let text = String::from_utf8_lossy(&value);
            let Some((until, entry)) = text.split_once(' ') else {
                continue;
            };
            let Ok(until) = until.parse::<i64>() else {
                continue;
            };
            // Aged out, though the servers' sweep has not removed it yet.
            if self.left_until(until).await?.is_none() {
                continue;
            }
            found.push(entry.to_owned());
        }
        Ok(found)
    }

    pub(super) async fn journalled_job_nodes(
        &self,
        namespace: &str,
    ) -> Result<Vec<String>, LockError> {
        let client = self.session.client();
        let dir = namespace_dir(namespace);
        let names = match client.list_children(&dir).await {
            Ok(names) => names,
            Err(Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(self.error(&format!("listing `{dir}` failed"), e, &client)),
        };
        let mut jobs = Vec::new();
        for name in names {
            let Some(job) = super::record::record_of_node(&name) else {
                continue;
            };
            // A job whose runs have all aged out is no journal any more.
            if !self.run_nodes(namespace, &job, 1).await?.is_empty() {
                jobs.push(job);
            }
        }
        Ok(jobs)
    }
}

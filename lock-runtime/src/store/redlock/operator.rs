//! What operators see and do on a Redlock quorum: one record combined from what the masters
//! answer (`inspect`, `list`) and forced releases fanned out to every master.

use std::sync::Arc;

use super::{NodeResult, RedlockBackend};
use crate::LockError;
use crate::store::listing::{LIST_TIMEOUT, combine_masters, combine_one};
use crate::store::{KeyNames, RecordView};

impl RedlockBackend {
    pub(super) async fn inspect_quorum(
        &self,
        names: &KeyNames,
    ) -> Result<Option<RecordView>, LockError> {
        let answers = {
            let names = names.clone();
            self.fan_out(move |node| {
                let names = names.clone();
                async move { node.inspect(&names).await }
            })
            .await
        };
        // The record a quorum agrees on (same owner and fence), with how the masters see it.
        let mut views = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(Some(view)) => views.push(view),
                Ok(None) => {}
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered(&format!("inspect of `{}`", names.key()), &errors)?;
        Ok(combine_one(views, errors.len(), self.nodes.len())
            .filter(|view| view.quorum.is_some_and(|q| q.agreeing >= self.quorum)))
    }

    /// Every record the masters list, combined per key with how many masters agree; keys
    /// held on fewer masters than a quorum are listed too, flagged by their view.
    pub(super) async fn list_combined(
        &self,
        namespace: &str,
        pattern: &str,
    ) -> Result<Vec<(String, RecordView)>, LockError> {
        let answers = {
            let (namespace, pattern) = (namespace.to_owned(), pattern.to_owned());
            self.fan_out_within(LIST_TIMEOUT, move |node| {
                let (namespace, pattern) = (namespace.clone(), pattern.clone());
                async move { node.list(&namespace, &pattern).await }
            })
            .await
        };
        let mut listed = Vec::new();
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(records) => listed.push(records),
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered("listing", &errors)?;
        Ok(combine_masters(listed, errors.len(), self.nodes.len()))
    }

    /// Removes the record carrying `fence` on every master that answers (the masters of the
    /// quorum carry the lease's fence); true if any had it.
    pub(super) async fn force_release_everywhere(
        &self,
        names: &KeyNames,
        fence: u64,
    ) -> Result<bool, LockError> {
        let answers = {
            let names = names.clone();
            self.fan_out(move |node| {
                let names = names.clone();
                async move { node.force_release(&names, fence).await }
            })
            .await
        };
        self.forced_somewhere(names, answers)
    }

    /// Removes the holding `holder` names on every master that answers (one holding carries
    /// one id on every master); true if any had it.
    pub(super) async fn force_release_holder_everywhere(
        &self,
        names: &KeyNames,
        holder: &str,
    ) -> Result<bool, LockError> {
        let answers = {
            let names = names.clone();
            let holder: Arc<str> = holder.into();
            self.fan_out(move |node| {
                let (names, holder) = (names.clone(), holder.clone());
                async move { node.force_release_holder(&names, &holder).await }
            })
            .await
        };
        self.forced_somewhere(names, answers)
    }

    /// What a forced release fanned out to every master comes to: true if any removed the
    /// record, an error if too few answered.
    fn forced_somewhere(
        &self,
        names: &KeyNames,
        answers: Vec<NodeResult<bool>>,
    ) -> Result<bool, LockError> {
        let mut removed = false;
        let mut errors = Vec::new();
        for answer in answers {
            match answer {
                Ok(here) => removed |= here,
                Err(e) => errors.push(e),
            }
        }
        self.enough_answered(&format!("forced release of `{}`", names.key()), &errors)?;
        Ok(removed)
    }
}

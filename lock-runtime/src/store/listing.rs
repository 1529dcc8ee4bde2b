//! What operators see: the key patterns of [`LockStore::list`](super::LockStore::list), their
//! translation for each store's own matching, and the Redlock masters' combined view.

use std::collections::HashMap;

use std::time::Duration;

use super::RecordView;

/// The least time a listing is given: it walks every record of the store, on every master.
pub(crate) const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// How the masters of a Redlock store see one lock, for operators (`list`, `inspect`,
/// lockctl): a lock is held when `agreeing` reaches a majority of `masters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QuorumView {
    /// Masters whose record is this one (same owner and holder id).
    pub agreeing: usize,
    /// Masters holding another record for the same lock (another owner or holding): the masters
    /// disagree, typically after a failed acquire or a master that restarted empty.
    pub disagreeing: usize,
    /// Masters that did not answer.
    pub unanswered: usize,
    /// Masters in all.
    pub masters: usize,
}

impl QuorumView {
    /// Whether a majority of the masters hold this record.
    pub fn has_quorum(&self) -> bool {
        self.agreeing > self.masters / 2
    }
}

/// Whether `key` matches `pattern`, where `*` stands for any run of characters (none
/// included) and `?` for one character; every other character stands for itself. This is the
/// pattern language of [`LockStore::list`](super::LockStore::list); a store may use it to
/// filter what its own matching returned.
pub fn key_matches(pattern: &str, key: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let key: Vec<char> = key.chars().collect();
    // Iterative wildcard matching with one backtrack point (the last `*`): linear in practice,
    // never exponential.
    let (mut p, mut k) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, k));
                p += 1;
            }
            Some(&c) if c == '?' || c == key[k] => {
                p += 1;
                k += 1;
            }
            _ => match star {
                Some((star_p, star_k)) => {
                    p = star_p + 1;
                    k = star_k + 1;
                    star = Some((star_p, star_k + 1));
                }
                None => return false,
            },
        }
    }
    pattern[p..].iter().all(|&c| c == '*')
}

/// The application's key of a record name `<namespace>:{<key>}` ([`KeyNames::record`]; keys
/// and namespaces never contain braces), or `None` for any other name: for a store's
/// [`LockStore::list`](super::LockStore::list) that keeps records by that name.
///
/// [`KeyNames::record`]: super::KeyNames::record
pub fn key_of_record(namespace: &str, record: &str) -> Option<String> {
    record
        .strip_prefix(namespace)?
        .strip_prefix(":{")?
        .strip_suffix('}')
        .filter(|key| !key.is_empty() && !key.contains(['{', '}']))
        .map(str::to_owned)
}

/// A Redis `SCAN ... MATCH` pattern for the records of `namespace` whose key matches
/// `pattern`: Redis' special characters (`[`, `]`, `\`) escaped, `*` kept, and `?` widened to
/// `*`, because Redis' `?` stands for one byte and a key's character may take several; the
/// caller filters what SCAN returns with [`key_matches`].
pub(crate) fn redis_match(namespace: &str, pattern: &str) -> String {
    fn escape(text: &str, wildcards: bool) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            match c {
                '*' | '?' if wildcards => out.push('*'),
                '[' | ']' | '\\' | '*' | '?' => {
                    out.push('\\');
                    out.push(c);
                }
                _ => out.push(c),
            }
        }
        out
    }
    format!("{}:{{{}}}", escape(namespace, false), escape(pattern, true))
}

/// A SQL `LIKE ... ESCAPE '!'` pattern for the records of `namespace` whose key matches
/// `pattern`: `*` becomes `%`, `?` becomes `_`, and `%`, `_`, `!` are escaped with `!`.
#[cfg(feature = "postgres")]
pub(crate) fn like_pattern(namespace: &str, pattern: &str) -> String {
    fn escape(text: &str, out: &mut String, wildcards: bool) {
        for c in text.chars() {
            match c {
                '*' if wildcards => out.push('%'),
                '?' if wildcards => out.push('_'),
                '%' | '_' | '!' => {
                    out.push('!');
                    out.push(c);
                }
                _ => out.push(c),
            }
        }
    }
    let mut out = String::new();
    escape(namespace, &mut out, false);
    out.push_str(":{");
    escape(pattern, &mut out, true);
    out.push('}');
    out
}

/// Combines what each Redlock master listed into one view per key: the record most masters
/// agree on, with a [`QuorumView`] saying how many agree, disagree or did not answer. Keys
/// held on fewer masters than a quorum are kept (flagged by their view): that is where an
/// operator needs to look.
pub(crate) fn combine_masters(
    answers: Vec<Vec<(String, RecordView)>>,
    unanswered: usize,
    masters: usize,
) -> Vec<(String, RecordView)> {
    let mut by_key: HashMap<String, Vec<RecordView>> = HashMap::new();
    for listed in answers {
        for (key, view) in listed {
            by_key.entry(key).or_default().push(view);
        }
    }
    let mut combined: Vec<(String, RecordView)> = by_key
        .into_iter()
        .filter_map(|(key, views)| Some((key, combine_one(views, unanswered, masters)?)))
        .collect();
    combined.sort_by(|a, b| a.0.cmp(&b.0));
    combined
}

/// The record most of `views` (one per master that has one) agree on, with its quorum view.
pub(crate) fn combine_one(
    views: Vec<RecordView>,
    unanswered: usize,
    masters: usize,
) -> Option<RecordView> {
    let holding = views.len();
    // One holding is one (owner, holder id): two records of one owner with different tokens
    // are two holdings, and agree on nothing.
    let mut tally: HashMap<(String, String), (usize, RecordView)> = HashMap::new();
    for view in views {
        tally
            .entry((view.owner.clone(), view.holder.clone()))
            .or_insert((0, view))
            .0 += 1;
    }
    let (agreeing, mut view) = tally
        .into_values()
        .max_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.fence.cmp(&b.1.fence)))?;
    view.quorum = Some(QuorumView {
        agreeing,
        disagreeing: holding - agreeing,
        unanswered,
        masters,
    });
    Some(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_like_globs() {
        assert!(key_matches("*", "anything"));
        assert!(key_matches("*", ""));
        assert!(key_matches("interest:*", "interest:2026-12-01"));
        assert!(!key_matches("interest:*", "report:2026-12-01"));
        assert!(key_matches("a?c", "abc"));
        assert!(!key_matches("a?c", "ac"));
        assert!(key_matches("*:done", "x:y:done"));
        assert!(key_matches("a*b*c", "a--b--b--c"));
        assert!(!key_matches("a*b*c", "a--b--b--"));
        assert!(key_matches("[x]", "[x]"), "brackets are plain characters");
        assert!(!key_matches("[x]", "x"));
        assert!(key_matches("é*", "été"));
    }

    #[test]
    fn records_give_back_their_keys() {
        assert_eq!(key_of_record("lock", "lock:{a:b}"), Some("a:b".to_owned()));
        assert_eq!(key_of_record("lock", "lock:{a}:fence"), None);
        assert_eq!(key_of_record("lock", "other:{a}"), None);
        assert_eq!(key_of_record("lock", "lock:{}"), None);
    }

    #[test]
    fn store_patterns_escape_what_the_store_would_read_as_special() {
        assert_eq!(redis_match("lock", "a*"), "lock:{a*}");
        assert_eq!(redis_match("lo[c]k", r"x[1]?\"), r"lo\[c\]k:{x\[1\]*\\}");
        assert_eq!(redis_match("n*s?", "k"), r"n\*s\?:{k}");
        #[cfg(feature = "postgres")]
        {
            assert_eq!(like_pattern("lock", "a*b?"), "lock:{a%b_}");
            assert_eq!(like_pattern("lo_ck", r"50%!\"), r"lo!_ck:{50!%!!\}");
        }
    }

    fn view(owner: &str, fence: u64) -> RecordView {
        RecordView::new(owner, fence, Some(Duration::from_secs(1)), Duration::ZERO)
    }

    #[test]
    fn masters_are_combined_with_their_disagreement() {
        let listed = vec![
            vec![
                ("a".to_owned(), view("x", 5)),
                ("b".to_owned(), view("y", 9)),
            ],
            vec![("a".to_owned(), view("x", 5))],
            vec![("a".to_owned(), view("z", 7))],
        ];
        let combined = combine_masters(listed, 1, 5);
        assert_eq!(combined.len(), 2);
        let (key, a) = &combined[0];
        assert_eq!(key, "a");
        assert_eq!((a.owner.as_str(), a.fence), ("x", Some(5)));
        let quorum = a.quorum.expect("a quorum view");
        assert_eq!(
            (
                quorum.agreeing,
                quorum.disagreeing,
                quorum.unanswered,
                quorum.masters
            ),
            (2, 1, 1, 5)
        );
        assert!(!quorum.has_quorum(), "2 of 5 is no majority");
        let b = combined[1].1.quorum.expect("a quorum view");
        assert_eq!((b.agreeing, b.disagreeing), (1, 0));
        let three = QuorumView {
            agreeing: 3,
            disagreeing: 0,
            unanswered: 0,
            masters: 5,
        };
        assert!(three.has_quorum());
    }

    #[test]
    fn masters_agree_only_on_one_holding() {
        // Three masters show one owner with no fence yet, but two holdings (a record left by
        // an acquire that failed, then a new one): no two of the three agree on a holding
        // with the third.
        let unfenced = |holder: &str| view("x", 0).with_holder(holder);
        let combined = combine_one(vec![unfenced("h1"), unfenced("h2"), unfenced("h2")], 0, 3)
            .expect("a record");
        assert_eq!(combined.holder, "h2");
        let quorum = combined.quorum.expect("a quorum view");
        assert_eq!((quorum.agreeing, quorum.disagreeing), (2, 1));
    }
}

//! Store addresses as lockctl shows them: without passwords.

/// `url` with the password of its user part (`user:password@`) replaced by `***`, as the
/// runtime shows it ([`lock_runtime::redact_url`]), and its query (which may carry
/// `password=`) too. A text that is not a URL (a PostgreSQL `key=value` connection string)
/// is not shown at all.
pub(crate) fn url(url: &str) -> String {
    if !url.contains("://") {
        return "(connection string not shown)".to_owned();
    }
    let shown = lock_runtime::redact_url(url);
    match shown.split_once('?') {
        Some((before, _)) => format!("{before}?***"),
        None => shown,
    }
}

/// `text` (an error message, say) with every URL in it redacted as [`url`] does.
pub(crate) fn text(text: &str) -> String {
    text.split(' ')
        .map(|word| {
            if word.contains("://") {
                let start = word.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(0);
                let (lead, rest) = word.split_at(start);
                format!("{lead}{}", url(rest))
            } else {
                word.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_show() {
        assert_eq!(url("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(url("redis://:s3cret@h:1/0"), "redis://:***@h:1/0");
        assert_eq!(url("rediss://app:pa@ss@h:1"), "rediss://app:***@h:1");
        assert_eq!(url("redis://token@h:1"), "redis://***@h:1");
        assert_eq!(
            url("postgres://app:pw@db/app?password=pw&sslmode=require"),
            "postgres://app:***@db/app?***"
        );
        assert_eq!(
            url("host=db user=app password=pw"),
            "(connection string not shown)"
        );
        assert_eq!(
            text("connecting to `redis://:pw@127.0.0.1:1`: refused"),
            "connecting to `redis://:***@127.0.0.1:1`: refused"
        );
    }
}

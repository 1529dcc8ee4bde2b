//! The store's URL handling and conversions.

use super::*;

#[test]
fn urls_are_shown_without_passwords() {
    for (url, shown) in [
        (
            "postgres://app:hunter2@127.0.0.1:5432/db",
            "postgres://app@127.0.0.1:5432/db",
        ),
        (
            "postgres://127.0.0.1/db?user=app&password=hunter2&sslmode=disable",
            "postgres://app@127.0.0.1:5432/db",
        ),
        (
            "host=127.0.0.1 port=5433 password = hunter2 user=app dbname=db",
            "postgres://app@127.0.0.1:5433/db",
        ),
        (
            "host=127.0.0.1 password='hunter2 and more' user=app",
            "postgres://app@127.0.0.1/",
        ),
        (
            "postgres://app:hunter2@127.0.0.1:nope/db",
            "<an unparsable PostgreSQL URL>",
        ),
    ] {
        assert_eq!(shown_url(url), shown, "{url}");
    }
}

#[test]
fn an_unencoded_at_in_the_password_is_refused() {
    assert!(check_url("postgres://app:p@ss@db/x").is_err());
    assert!(check_url("postgres://app:p%40ss@db/x").is_ok());
    assert!(check_url("host=db password=p@ss").is_ok());
}

#[test]
fn milliseconds_round_up() {
    assert_eq!(millis(Duration::from_micros(1)), 1);
    assert_eq!(millis(Duration::from_millis(30_000)), 30_000);
    assert_eq!(duration(-5), Duration::ZERO);
}

//! Replies of a RESP2 connection (the protocol a Redis server speaks until `HELLO 3`), read
//! from the front of a buffer for the lean connection (`wire`): simple strings, errors,
//! integers, bulk strings and arrays. Error replies are handed to redis-rs' own parser, so
//! they carry the kinds its callers test (`NOSCRIPT` for a script to load again, `READONLY`).
//! Commands go the other way as arrays of bulk strings ([`write_command`]).

use redis::{RedisError, Value};

/// How deep arrays may nest: the store's replies nest two levels (`SCAN`); more means the
/// stream is not what this connection expects.
const MAX_DEPTH: usize = 8;

/// The longest bulk string a server sends (Redis' `proto-max-bulk-len` default, 512 MB).
const MAX_BULK: usize = 512 * 1024 * 1024;

/// One argument of a command: the bytes of up to three pieces, one after the other. A record's
/// value goes out as its token, its fields and its owner, never joined into a string of its
/// own.
#[derive(Clone, Copy)]
pub(crate) struct Arg<'a>([&'a [u8]; 3]);

impl<'a> Arg<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Arg([bytes, b"", b""])
    }

    pub(crate) fn joined(pieces: [&'a [u8]; 3]) -> Self {
        Arg(pieces)
    }

    fn len(&self) -> usize {
        self.0.iter().map(|p| p.len()).sum()
    }

    /// The argument's bytes in one piece.
    pub(crate) fn to_vec(self) -> Vec<u8> {
        self.0.concat()
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(text: &'a str) -> Self {
        Arg::new(text.as_bytes())
    }
}

/// Appends `args` to `buf` as one command (an array of bulk strings), as `redis::Cmd` packs it.
pub(crate) fn write_command(buf: &mut Vec<u8>, args: &[Arg<'_>]) {
    buf.reserve(args.iter().map(|a| a.len() + 16).sum::<usize>() + 16);
    write_header(buf, b'*', args.len());
    for arg in args {
        write_header(buf, b'$', arg.len());
        for piece in arg.0 {
            buf.extend_from_slice(piece);
        }
        buf.extend_from_slice(b"\r\n");
    }
}

fn write_header(buf: &mut Vec<u8>, tag: u8, n: usize) {
    buf.push(tag);
    buf.extend_from_slice(Decimal::of(n as u64).as_bytes());
    buf.extend_from_slice(b"\r\n");
}

/// A number in decimal, on the stack: an argument of a command without a string for it.
pub(crate) struct Decimal {
    digits: [u8; 20],
    start: usize,
}

impl Decimal {
    pub(crate) fn of(mut n: u64) -> Decimal {
        let mut digits = [0u8; 20];
        let mut start = digits.len();
        loop {
            start -= 1;
            // n % 10 < 10: the cast keeps every bit.
            digits[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        Decimal { digits, start }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.digits[self.start..]
    }
}

/// The first whole reply in `buf` and the number of bytes it took, or None while it is
/// incomplete. An error means the stream cannot be read on: the connection must go.
pub(super) fn parse(buf: &[u8]) -> Result<Option<(Value, usize)>, RedisError> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], pos: usize, depth: usize) -> Result<Option<(Value, usize)>, RedisError> {
    let Some((line, next)) = line(buf, pos)? else {
        return Ok(None);
    };
    let Some((&tag, body)) = line.split_first() else {
        return Err(protocol("an empty line"));
    };
    let value = match tag {
        b'+' if body == b"OK" => Value::Okay,
        b'+' => Value::SimpleString(String::from_utf8_lossy(body).into_owned()),
        // The line with its CRLF, as redis-rs reads an error.
        b'-' => redis::parse_redis_value(&buf[pos..next])?,
        b':' => Value::Int(integer(body)?),
        b'$' => {
            let len = integer(body)?;
            if len < 0 {
                Value::Nil
            } else {
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= MAX_BULK)
                    .ok_or_else(|| protocol("a bulk length"))?;
                let end = next + len;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(protocol("a bulk string without its CRLF"));
                }
                return Ok(Some((Value::BulkString(buf[next..end].to_vec()), end + 2)));
            }
        }
        b'*' => {
            let count = integer(body)?;
            if count < 0 {
                Value::Nil
            } else {
                if depth >= MAX_DEPTH {
                    return Err(protocol("arrays nested too deep"));
                }
                let count = usize::try_from(count).map_err(|_| protocol("an array length"))?;
                // Not sized by the count: the buffer may not hold the whole array yet.
                let mut items = Vec::with_capacity(count.min(64));
                let mut at = next;
                for _ in 0..count {
                    let Some((item, end)) = parse_at(buf, at, depth + 1)? else {
                        return Ok(None);
                    };
                    items.push(item);
                    at = end;
                }
                return Ok(Some((Value::Array(items), at)));
            }
        }
        _ => return Err(protocol("a reply type outside RESP2")),
    };
    Ok(Some((value, next)))
}

/// The line starting at `pos`, without its CRLF, and where the next one starts; None while
/// its end has not arrived.
fn line(buf: &[u8], pos: usize) -> Result<Option<(&[u8], usize)>, RedisError> {
    let rest = buf.get(pos..).unwrap_or_default();
    let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
        return Ok(None);
    };
    let line = rest[..lf]
        .strip_suffix(b"\r")
        .ok_or_else(|| protocol("a line without its CR"))?;
    Ok(Some((line, pos + lf + 1)))
}

fn integer(digits: &[u8]) -> Result<i64, RedisError> {
    std::str::from_utf8(digits)
        .ok()
        .and_then(|text| text.parse().ok())
        .ok_or_else(|| protocol("an integer"))
}

fn protocol(what: &'static str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Parse,
        "unexpected reply from Redis",
        format!("could not read {what}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(bytes: &[u8]) -> Value {
        match parse(bytes) {
            Ok(Some((value, used))) => {
                assert_eq!(used, bytes.len(), "{bytes:?}");
                value
            }
            other => panic!("{bytes:?}: {other:?}"),
        }
    }

    #[test]
    fn commands_are_packed_as_redis_rs_packs_them() {
        for n in [0u64, 7, 10, 99, 100, 123_456_789, u64::MAX] {
            assert_eq!(Decimal::of(n).as_bytes(), n.to_string().as_bytes());
        }
        let mut buf = b"before".to_vec();
        let ttl = Decimal::of(30_000);
        write_command(
            &mut buf,
            &[
                "SET".into(),
                "lock:{k}".into(),
                Arg::joined([b"tok", b" - - 0 ", "hôst:1".as_bytes()]),
                Arg::joined([b"", b"", b""]),
                Arg::joined([b"P", b"", b"X"]),
                Arg::new(ttl.as_bytes()),
            ],
        );
        let mut cmd = redis::cmd("SET");
        cmd.arg("lock:{k}")
            .arg("tok - - 0 hôst:1")
            .arg("")
            .arg("PX")
            .arg(30_000);
        let mut expected = b"before".to_vec();
        expected.extend_from_slice(&cmd.get_packed_command());
        assert_eq!(buf, expected);
        let mut empty = Vec::new();
        write_command(&mut empty, &[]);
        assert_eq!(empty, b"*0\r\n");
    }

    #[test]
    fn every_resp2_shape_reads_as_redis_rs_reads_it() {
        for bytes in [
            &b"+OK\r\n"[..],
            b"+PONG\r\n",
            b":-42\r\n",
            b"$5\r\nhe\r\no\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n$1\r\na\r\n:7\r\n*2\r\n+x\r\n$-1\r\n",
        ] {
            assert_eq!(Ok(whole(bytes)), redis::parse_redis_value(bytes));
        }
    }

    #[test]
    fn error_replies_keep_their_kind() {
        let Value::ServerError(e) = whole(b"-NOSCRIPT No matching script.\r\n") else {
            panic!("not an error");
        };
        let e = RedisError::from(e);
        assert_eq!(
            e.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        );
        // Inside an array (EXEC), too.
        let Value::Array(items) = whole(b"*2\r\n+OK\r\n-READONLY no\r\n") else {
            panic!("not an array");
        };
        assert!(matches!(items[1], Value::ServerError(_)));
    }

    #[test]
    fn a_reply_cut_anywhere_waits_for_the_rest() {
        let bytes = b"*3\r\n$5\r\nhello\r\n:12\r\n*1\r\n+OK\r\n";
        for cut in 0..bytes.len() {
            assert!(
                matches!(parse(&bytes[..cut]), Ok(None)),
                "cut at {cut}: {:?}",
                parse(&bytes[..cut])
            );
        }
        // Two replies in a row: the first, and where the second starts.
        let two = b":1\r\n:2\r\n";
        assert_eq!(parse(two).ok(), Some(Some((Value::Int(1), 4))));
    }

    #[test]
    fn what_is_no_resp2_reply_breaks_the_stream() {
        for bytes in [
            &b"%1\r\n+a\r\n+b\r\n"[..],
            b"\r\n",
            b":12x\r\n",
            b"$3\r\nabcd\r\n",
            b"$x\r\n",
            b"+OK\n",
            b"$999999999999\r\n",
        ] {
            assert!(parse(bytes).is_err(), "{bytes:?}");
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 1) + ":1\r\n";
        assert!(parse(deep.as_bytes()).is_err());
    }
}

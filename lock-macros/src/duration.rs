//! Duration text of the attribute ("60s", "1m30s", "500ms", "7d"), checked at expansion time.

/// Parses a duration into milliseconds. Units: ms, s, m, h, d; several parts add up ("1h30m").
pub(crate) fn parse_millis(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("empty duration; write e.g. \"30s\", \"5m\", \"1h30m\" or \"500ms\"".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "`{text}` is not a duration: expected a number at `{rest}`; write e.g. \"30s\", \"5m\", \"1h30m\" or \"500ms\""
            ));
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}`: the number `{}` is too large", &rest[..digits]))?;
        rest = &rest[digits..];
        // The unit runs to the next digit; spaces inside it make it unknown, not missing.
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = rest[..unit_len].trim();
        let scale: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(format!(
                    "`{text}`: the number {number} has no unit; add one of ms, s, m, h, d"
                ));
            }
            other => {
                return Err(format!(
                    "`{text}`: unknown unit `{other}`; use one of ms, s, m, h, d"
                ));
            }
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(scale)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| format!("`{text}` is too long a duration"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse_millis("500ms"), Ok(500));
        assert_eq!(parse_millis("60s"), Ok(60_000));
        assert_eq!(parse_millis("1m30s"), Ok(90_000));
        assert_eq!(parse_millis("2h"), Ok(7_200_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
        assert_eq!(parse_millis("0s"), Ok(0));
    }

    #[test]
    fn rejects_bad_text() {
        assert!(parse_millis("").is_err());
        assert!(parse_millis("60").is_err());
        assert!(parse_millis("s").is_err());
        assert!(parse_millis("5 minutes").is_err_and(|e| e.contains("unknown unit `minutes`")));
        assert!(parse_millis("10y").is_err());
        assert!(parse_millis("99999999999999999999s").is_err());
        assert!(parse_millis("999999999999999d").is_err());
    }
}

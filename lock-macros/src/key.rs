//! The `key` template: literal text with `{param}`, `{param.field}` and `{self.field}`
//! placeholders, checked against the function's parameters.

/// One piece of a key template.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece {
    Text(String),
    /// A placeholder: `param` or `param.field.field`, split on dots.
    Placeholder(Vec<String>),
}

/// Splits a key template into text and placeholders; `params` are the names a placeholder may
/// start with (the function's parameters, and `self` for methods).
pub(crate) fn parse_template(template: &str, params: &[String]) -> Result<Vec<Piece>, String> {
    if template.is_empty() {
        return Err("`key` must not be empty".into());
    }
    if template.chars().any(char::is_control) {
        return Err("`key` must not contain control characters".into());
    }
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices();
    while let Some((start, c)) = chars.next() {
        match c {
            '{' => {
                let inner_start = start + 1;
                let Some(end) = template[inner_start..].find('}') else {
                    return Err(format!(
                        "unclosed `{{` in key `{template}`; placeholders look like `{{param}}` or `{{param.field}}`"
                    ));
                };
                let inner = &template[inner_start..inner_start + end];
                let path = parse_placeholder(inner, template)?;
                if !params.iter().any(|p| *p == path[0]) {
                    let known = if params.is_empty() {
                        "the function has no parameters".to_owned()
                    } else {
                        format!("parameters: {}", params.join(", "))
                    };
                    return Err(format!(
                        "placeholder `{{{inner}}}` names no parameter of this function ({known})"
                    ));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(Piece::Placeholder(path));
                // Skip the placeholder's characters.
                for _ in 0..inner.chars().count() + 1 {
                    chars.next();
                }
            }
            '}' => {
                return Err(format!(
                    "unmatched `}}` in key `{template}`; braces only delimit placeholders"
                ));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

fn parse_placeholder(inner: &str, template: &str) -> Result<Vec<String>, String> {
    let path: Vec<String> = inner.split('.').map(|s| s.trim().to_owned()).collect();
    let valid = path.iter().all(|segment| is_ident(segment));
    if inner.is_empty() || !valid {
        return Err(format!(
            "invalid placeholder `{{{inner}}}` in key `{template}`; write `{{param}}`, `{{param.field}}` or `{{self.field}}`"
        ));
    }
    Ok(path)
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c == '_' || c.is_alphabetic() => {}
        _ => return false,
    }
    chars.all(|c| c == '_' || c.is_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Vec<String> {
        vec!["account".into(), "self".into(), "day".into()]
    }

    #[test]
    fn splits_text_and_placeholders() {
        assert_eq!(
            parse_template("interest:{account.id}:{day}", &params()),
            Ok(vec![
                Piece::Text("interest:".into()),
                Piece::Placeholder(vec!["account".into(), "id".into()]),
                Piece::Text(":".into()),
                Piece::Placeholder(vec!["day".into()]),
            ])
        );
        assert_eq!(
            parse_template("plain", &params()),
            Ok(vec![Piece::Text("plain".into())])
        );
        assert_eq!(
            parse_template("{self.name}", &params()),
            Ok(vec![Piece::Placeholder(vec!["self".into(), "name".into()])])
        );
    }

    #[test]
    fn rejects_bad_templates() {
        assert!(parse_template("", &params()).is_err());
        assert!(parse_template("a{b", &params()).is_err());
        assert!(parse_template("a}b", &params()).is_err());
        assert!(parse_template("a{}", &params()).is_err());
        assert!(parse_template("a{1x}", &params()).is_err());
        assert!(parse_template("{{account}}", &params()).is_err());
        let err = parse_template("x:{acount}", &params()).expect_err("typo");
        assert!(err.contains("account"), "{err}");
    }
}

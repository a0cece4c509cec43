//! Shell words on one line, both ways: quoting a word so that `sh` reads it
//! back unchanged ([`quote`]), and splitting a line that only holds literal
//! words into those words ([`split`]). Used for the `/etc/rc` script of
//! enroot's image layout (see [`super::carried`]), whose words bash's `@Q`
//! quoting wrote: `'...'`, `'\''` for a quote, `$'...'` for control
//! characters, `"..."` around the working directory.
//!
//! [`split`] refuses anything it cannot read as plain words (an expansion, a
//! command substitution, an operator): such a script means more than a
//! list of words, and guessing would run something else than enroot would.

/// One word of a split line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Word {
    /// A literal word.
    Text(String),
    /// Exactly `"$@"`: the script's arguments.
    AllArgs,
}

/// `word` in single quotes, each `'` written as `'\''`: POSIX `sh` reads it
/// back as exactly `word`.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `word` in double quotes, with `\`, `"`, `$` and `` ` `` escaped.
pub fn quote_double(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('"');
    for c in word.chars() {
        if matches!(c, '\\' | '"' | '$' | '`') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// The words of `line`, or why it is more than a list of literal words.
pub fn split(line: &str) -> Result<Vec<Word>, String> {
    let mut words = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.next_if(|c| *c == ' ' || *c == '\t').is_some() {}
        if chars.peek().is_none() {
            return Ok(words);
        }
        let mut word = String::new();
        let mut raw = String::new();
        while let Some(&c) = chars.peek() {
            if c == ' ' || c == '\t' {
                break;
            }
            chars.next();
            raw.push(c);
            match c {
                '\'' => read_single(&mut chars, &mut word, &mut raw)?,
                '"' => read_double(&mut chars, &mut word, &mut raw)?,
                '\\' => {
                    let next = chars.next().ok_or("a backslash at the end of the line")?;
                    raw.push(next);
                    word.push(next);
                }
                '$' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    raw.push('\'');
                    read_ansi_c(&mut chars, &mut word, &mut raw)?;
                }
                '$' | '`' => return Err(format!("a shell expansion ({c}) outside quotes")),
                ';' | '&' | '|' | '<' | '>' | '(' | ')' | '#' | '*' | '?' | '[' | '~' | '{' => {
                    return Err(format!("the shell character {c} outside quotes"))
                }
                c => word.push(c),
            }
        }
        if raw == "\"$@\"" {
            words.push(Word::AllArgs);
        } else if raw.starts_with("\"$@\"") {
            return Err("\"$@\" joined to more text".into());
        } else {
            words.push(Word::Text(word));
        }
    }
}

type Chars<'a> = std::iter::Peekable<std::str::Chars<'a>>;

/// The rest of a `'...'` part, up to its closing quote.
fn read_single(chars: &mut Chars, word: &mut String, raw: &mut String) -> Result<(), String> {
    for c in chars.by_ref() {
        raw.push(c);
        if c == '\'' {
            return Ok(());
        }
        word.push(c);
    }
    Err("a single quote that is never closed".into())
}

/// The rest of a `"..."` part; `"$@"` alone is kept in `raw` for the caller.
fn read_double(chars: &mut Chars, word: &mut String, raw: &mut String) -> Result<(), String> {
    while let Some(c) = chars.next() {
        raw.push(c);
        match c {
            '"' => return Ok(()),
            '\\' => {
                let next = chars.next().ok_or("a double quote that is never closed")?;
                raw.push(next);
                if !matches!(next, '\\' | '"' | '$' | '`') {
                    word.push('\\');
                }
                word.push(next);
            }
            '$' if raw == "\"$" && chars.peek() == Some(&'@') => {
                chars.next();
                raw.push('@');
                if chars.peek() != Some(&'"') {
                    return Err("\"$@\" with more in its quotes".into());
                }
            }
            '$' | '`' => return Err(format!("a shell expansion ({c}) in double quotes")),
            c => word.push(c),
        }
    }
    Err("a double quote that is never closed".into())
}

/// The rest of a `$'...'` part, with its backslash escapes.
fn read_ansi_c(chars: &mut Chars, word: &mut String, raw: &mut String) -> Result<(), String> {
    while let Some(c) = chars.next() {
        raw.push(c);
        match c {
            '\'' => return Ok(()),
            '\\' => {
                let next = chars.next().ok_or("a $'...' word that is never closed")?;
                raw.push(next);
                match next {
                    'n' => word.push('\n'),
                    't' => word.push('\t'),
                    'r' => word.push('\r'),
                    'a' => word.push('\x07'),
                    'b' => word.push('\x08'),
                    'e' | 'E' => word.push('\x1b'),
                    'f' => word.push('\x0c'),
                    'v' => word.push('\x0b'),
                    '\\' | '\'' | '"' | '?' => word.push(next),
                    '0'..='7' => {
                        let mut value = next.to_digit(8).unwrap_or(0);
                        for _ in 0..2 {
                            match chars.next_if(|d| d.is_digit(8)) {
                                Some(d) => {
                                    raw.push(d);
                                    value = value * 8 + d.to_digit(8).unwrap_or(0);
                                }
                                None => break,
                            }
                        }
                        word.push(char::from_u32(value).ok_or("a bad octal escape")?);
                    }
                    'x' => {
                        let mut value = 0;
                        let mut digits = 0;
                        while digits < 2 {
                            match chars.next_if(|d| d.is_ascii_hexdigit()) {
                                Some(d) => {
                                    raw.push(d);
                                    value = value * 16 + d.to_digit(16).unwrap_or(0);
                                    digits += 1;
                                }
                                None => break,
                            }
                        }
                        if digits == 0 {
                            return Err("a \\x escape without digits".into());
                        }
                        word.push(char::from_u32(value).ok_or("a bad hex escape")?);
                    }
                    other => return Err(format!("the escape \\{other} in $'...'")),
                }
            }
            c => word.push(c),
        }
    }
    Err("a $'...' word that is never closed".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(line: &str) -> Vec<String> {
        split(line)
            .unwrap()
            .into_iter()
            .map(|w| match w {
                Word::Text(t) => t,
                Word::AllArgs => "<ARGS>".into(),
            })
            .collect()
    }

    #[test]
    fn reads_what_bash_quoting_writes() {
        // bash 5: a=(/usr/bin/tini -- "it's" $'a\nb' '') ; echo "${a[@]@Q}"
        let line = r#"'/usr/bin/tini' '--' 'it'\''s' $'a\nb' '' "$@""#;
        assert_eq!(
            texts(line),
            ["/usr/bin/tini", "--", "it's", "a\nb", "", "<ARGS>"]
        );
        assert_eq!(texts(r#""/work dir""#), ["/work dir"]);
        assert_eq!(texts(r#"plain "a\"b" \$x"#), ["plain", "a\"b", "$x"]);
        assert_eq!(texts(r"$'\x41\101\t'"), ["AA\t"]);
        assert_eq!(texts("   "), Vec::<String>::new());
    }

    #[test]
    fn refuses_what_is_more_than_words() {
        for line in [
            "$HOME",
            "\"$HOME\"",
            "a; b",
            "a && b",
            "`id`",
            "\"$(id)\"",
            "'open",
            "\"open",
            "*.sh",
            "\"$@x\"",
        ] {
            assert!(split(line).is_err(), "{line}");
        }
        // "$@" only counts on its own.
        assert!(split(r#"a"$@""#).is_err());
        assert!(split(r#""$@"a"#).is_err());
    }

    #[test]
    fn quoted_words_read_back() {
        for word in [
            "", "plain", "it's", "a b", "$HOME", "`x`", "\"q\"", "\\", "tab\t",
        ] {
            assert_eq!(texts(&quote(word)), [word], "{word}");
            assert_eq!(texts(&quote_double(word)), [word], "{word}");
        }
    }
}

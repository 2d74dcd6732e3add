//! nginx Plus's `sticky cookie NAME [expires=TIME] [domain=D] [httponly] [samesite=S] [secure]
//! [path=P]` in an upstream block, as the upstream's `sticky` table. nginx OSS has no sticky
//! directive; its other forms (`sticky route`, `sticky learn`) pick a backend from what the
//! application sets, which pinlb does not read, and are left out with a note.
//!
//! What differs, noted: nginx Plus's value is an MD5 of the backend's address, pinlb's a keyed
//! xxh3 (clients holding nginx's cookie get pinlb's once, then stay); nginx sends no `Path`
//! unless told (the browser then scopes the cookie to the request's directory), pinlb `Path=/`;
//! `expires=max` (ten years) becomes pinlb's longest `max_age`, 365 days.

use std::time::Duration;

use pinlb::config::raw::Dur;
use pinlb::modules::sticky::Raw;

use super::parse::Directive;
use super::values::spanned;

/// nginx Plus's `expires=max`, as long as pinlb's `max_age` goes.
const MAX_AGE: Duration = Duration::from_secs(365 * 86_400);

/// The `sticky` table for directive `d`, or why it does not convert.
pub(super) fn convert(d: &Directive, notes: &mut Vec<String>) -> Result<Raw, String> {
    let (Some("cookie"), Some(name)) = (d.args.first().map(String::as_str), d.args.get(1)) else {
        return Err(
            "only `sticky cookie NAME …` converts (pinlb inserts its own cookie; it reads no route or learned session)"
                .into(),
        );
    };
    if !pinlb::config::is_cookie_name(name) {
        return Err(format!("\"{name}\" is not a valid cookie name"));
    }
    let mut t = Raw {
        cookie: spanned(name.clone()),
        path: None,
        domain: None,
        max_age: None,
        secure: None,
        // nginx Plus sets HttpOnly only when asked; pinlb by default: written out either way.
        httponly: Some(false),
        samesite: None,
        seed: None,
    };
    for arg in &d.args[2..] {
        let (key, value) = arg.split_once('=').unwrap_or((arg, ""));
        match (key, value) {
            ("httponly", "") => t.httponly = Some(true),
            ("secure", "") => t.secure = Some(true),
            ("expires", "max") => {
                t.max_age = Some(spanned(Dur(MAX_AGE)));
                notes.push(format!(
                    "{}: sticky cookie expires=max became max_age = \"{}\", 365 days (nginx's is ten years)",
                    d.at(),
                    Dur(MAX_AGE)
                ));
            }
            ("expires", v) => match humantime::parse_duration(v) {
                Ok(age) if age.as_secs() > 0 => {
                    let age = Duration::from_secs(age.min(MAX_AGE).as_secs());
                    t.max_age = Some(spanned(Dur(age)));
                }
                _ => return Err(format!("expires={v} is not a time pinlb reads")),
            },
            ("domain", v) if !v.is_empty() && !v.starts_with('$') => {
                t.domain = Some(spanned(v.into()));
            }
            ("path", v) if v.starts_with('/') => t.path = Some(spanned(v.into())),
            ("samesite", v)
                if ["strict", "lax", "none"].contains(&v.to_ascii_lowercase().as_str()) =>
            {
                t.samesite = Some(spanned(v.to_ascii_lowercase()));
            }
            _ => return Err(format!("parameter {arg} has no pinlb equivalent")),
        }
    }
    if t.path.is_none() {
        notes.push(format!(
            "{}: sticky cookie {name} gets Path=/ (nginx sends no Path unless path= is given)",
            d.at()
        ));
    }
    notes.push(format!(
        "{}: sticky cookie {name}: pinlb's values differ from nginx Plus's, so a client holding nginx's cookie is given pinlb's once, then stays on its backend",
        d.at()
    ));
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn directive(args: &[&str]) -> Directive {
        Directive {
            name: "sticky".into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block: None,
            file: "nginx.conf".into(),
            line: 3,
        }
    }

    #[test]
    fn sticky_cookie_converts_with_its_parameters() {
        let mut notes = Vec::new();
        let d = directive(&[
            "cookie",
            "srv_id",
            "expires=1h",
            "domain=.example.com",
            "path=/",
            "httponly",
            "secure",
            "samesite=Lax",
        ]);
        let text = toml::to_string(&convert(&d, &mut notes).unwrap()).unwrap();
        for line in [
            "cookie = \"srv_id\"",
            "max_age = \"3600s\"",
            "domain = \".example.com\"",
            "path = \"/\"",
            "httponly = true",
            "secure = true",
            "samesite = \"lax\"",
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        assert_eq!(notes.len(), 1, "{notes:?}");
    }

    #[test]
    fn nginx_defaults_are_written_out() {
        let mut notes = Vec::new();
        let t = convert(&directive(&["cookie", "srv_id"]), &mut notes).unwrap();
        assert_eq!(t.httponly, Some(false));
        assert!(t.path.is_none());
        assert!(notes.iter().any(|n| n.contains("Path=/")), "{notes:?}");
        let t = convert(&directive(&["cookie", "s", "expires=max"]), &mut notes).unwrap();
        let text = toml::to_string(&t).unwrap();
        assert!(text.contains("max_age = \"31536000s\""), "{text}");
    }

    #[test]
    fn other_forms_and_parameters_are_refused_with_the_reason() {
        let mut notes = Vec::new();
        for (args, says) in [
            (&["route", "$route_cookie"][..], "only `sticky cookie NAME"),
            (&["learn", "create=$x"][..], "only `sticky cookie NAME"),
            (&["cookie"][..], "only `sticky cookie NAME"),
            (&["cookie", "a=b"][..], "not a valid cookie name"),
            (&["cookie", "s", "samesite=$v"][..], "samesite=$v"),
            (&["cookie", "s", "expires=soon"][..], "expires=soon"),
            (&["cookie", "s", "path=app"][..], "path=app"),
        ] {
            let e = convert(&directive(args), &mut notes).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }
}

//! `fastcgi_pass` locations as routes to an upstream with `protocol = "fastcgi"` and its
//! `[upstream.NAME.fastcgi]` table: the usual PHP shape, `location ~ \.php$ { include
//! snippets/fastcgi-php.conf; fastcgi_pass unix:/run/php/php8.2-fpm.sock; }`.
//!
//! - `fastcgi_pass ADDR` (TCP, `unix:/path`, or an `upstream` block's name) is the upstream's
//!   backend; the location's (or server's) `root` is `fastcgi.root`, `fastcgi_index` is
//!   `index`, `fastcgi_split_path_info` is `split_path_info`.
//! - `fastcgi_param NAME constant` is a `params` entry when pinlb does not set NAME itself; a
//!   line of nginx's standard set ([`STANDARD`], Debian's `fastcgi_params` and `fastcgi.conf`)
//!   is what pinlb sends anyway; any other variable is refused, naming it.
//! - `include fastcgi_params;`, `include fastcgi.conf;` and `include snippets/fastcgi-php.conf;`
//!   are known by name ([`super::parse::STANDARD_INCLUDES`]), as they live in /etc/nginx: the
//!   standard set, and for Debian's snippet also `fastcgi_split_path_info ^(.+?\.php)(/.*)$`,
//!   `fastcgi_index index.php` and `try_files $fastcgi_script_name =404` (a note: pinlb checks
//!   no files, php-fpm answers 404 for a missing script itself).
//! - A `location /` that only `try_files $uri $uri/ /index.php?$query_string` is a route to the
//!   same backends with `script = "/index.php"` ([`front_controller`]): every path runs it, and
//!   the files nginx would send as they are (and directories' indexes) are not served (a note).
//! - `fastcgi_param`, `fastcgi_index` and the standard includes are inherited from the server
//!   and `http` as nginx's are ([`inherit`]).
//! - One upstream per address and root: two FastCGI locations with different roots (or
//!   indexes, splits, params) get two upstreams, the second named `ADDR#2`.

use std::collections::BTreeMap;

use pinlb::config::raw::{RawFastcgi, RawUpstream};
use toml::Spanned;

use super::parse::Directive;
use super::values::spanned;

/// The `fastcgi_*` directives read here, which the converter leaves to this module.
pub(super) const NAMES: [&str; 5] = [
    "fastcgi_pass",
    "fastcgi_param",
    "fastcgi_index",
    "fastcgi_split_path_info",
    "fastcgi_keep_conn",
];

/// nginx's standard `fastcgi_param` lines (Debian's `fastcgi_params` and `fastcgi.conf`, and
/// the snippet's `PATH_INFO`): pinlb sends each of these itself, from the same request.
const STANDARD: [(&str, &[&str]); 24] = [
    (
        "SCRIPT_FILENAME",
        &["$document_root$fastcgi_script_name", "$request_filename"],
    ),
    ("QUERY_STRING", &["$query_string", "$args"]),
    ("REQUEST_METHOD", &["$request_method"]),
    ("CONTENT_TYPE", &["$content_type"]),
    ("CONTENT_LENGTH", &["$content_length"]),
    ("SCRIPT_NAME", &["$fastcgi_script_name"]),
    ("REQUEST_URI", &["$request_uri"]),
    ("DOCUMENT_URI", &["$document_uri", "$uri"]),
    ("DOCUMENT_ROOT", &["$document_root", "$realpath_root"]),
    ("SERVER_PROTOCOL", &["$server_protocol"]),
    ("REQUEST_SCHEME", &["$scheme"]),
    ("HTTPS", &["$https"]),
    ("GATEWAY_INTERFACE", &["CGI/1.1"]),
    ("SERVER_SOFTWARE", &["nginx/$nginx_version"]),
    ("REMOTE_ADDR", &["$remote_addr"]),
    ("REMOTE_PORT", &["$remote_port"]),
    ("REMOTE_USER", &["$remote_user"]),
    ("SERVER_ADDR", &["$server_addr"]),
    ("SERVER_PORT", &["$server_port"]),
    ("SERVER_NAME", &["$server_name", "$host"]),
    ("REDIRECT_STATUS", &["200"]),
    ("HTTP_HOST", &["$host", "$http_host"]),
    ("PATH_INFO", &["$fastcgi_path_info", "$path_info"]),
    ("PATH_TRANSLATED", &["$document_root$fastcgi_path_info"]),
];

/// The names pinlb sets itself (`proxy/src/fastcgi/params.rs`): a `params` entry of one of these
/// would replace pinlb's value for every request, so only [`STANDARD`]'s values are accepted.
fn pinlb_sets(name: &str) -> bool {
    STANDARD.iter().any(|(n, _)| *n == name) || name.starts_with("HTTP_")
}

/// What pinlb does differently from the standard set, once per import.
pub(super) const STANDARD_NOTE: &str = "nginx's standard FastCGI parameters are pinlb's own, but REMOTE_USER is not sent, SERVER_SOFTWARE is pinlb, HTTP_HOST is the Host as the client sent it (port included) and SERVER_NAME the Host without its port (docs/configuration.md, [upstream.NAME.fastcgi])";

/// Debian's `snippets/fastcgi-php.conf`'s split.
const SNIPPET_SPLIT: &str = r"^(.+?\.php)(/.*)$";

/// Whether `d` is one a FastCGI location inherits from its server or `http` (nginx's
/// `fastcgi_param` array, `fastcgi_index`, and the standard includes that hold them).
pub(super) fn inherited(d: &Directive) -> bool {
    let include = d.name == "include"
        && (d.args.first()).is_some_and(|a| super::parse::is_standard_include(a));
    d.block.is_none() && (include || d.name == "fastcgi_param" || d.name == "fastcgi_index")
}

/// What a level's own directives make of the FastCGI lines it inherits: a level with any
/// `fastcgi_param` (or standard include) of its own inherits none of the outer ones (nginx's
/// array directives), and its `fastcgi_index` replaces the outer one. The rest of the block
/// (a location's `fastcgi_split_path_info`, `try_files`) is kept, for [`table`].
pub(super) fn inherit(outer: &[Directive], block: &[Directive]) -> Vec<Directive> {
    let params = |d: &Directive| inherited(d) && d.name != "fastcgi_index";
    let own_params = block.iter().any(params);
    let own_index = block.iter().any(|d| d.name == "fastcgi_index");
    let kept = outer
        .iter()
        .filter(|d| (d.name == "fastcgi_index" && !own_index) || (params(d) && !own_params));
    let own = block.iter().filter(|d| {
        d.block.is_none()
            && (inherited(d) || d.name == "fastcgi_split_path_info" || d.name == "try_files")
    });
    kept.chain(own).cloned().collect()
}

/// Whether a location's block passes requests to a FastCGI server.
pub(super) fn passes(block: &[Directive]) -> bool {
    block.iter().any(|d| d.name == "fastcgi_pass")
}

/// A FastCGI location's `[upstream.NAME.fastcgi]` table, from its block and the `root` in
/// force; `Err` (a refusal, at the directive) for what pinlb can't do as nginx does. Notes for
/// what differs but converts.
pub(super) fn table(
    block: &[Directive],
    root: Option<&str>,
    notes: &mut Vec<String>,
) -> Result<RawFastcgi, String> {
    let mut params = BTreeMap::new();
    let mut index: Option<String> = None;
    let mut split: Option<String> = None;
    for d in block {
        let arg = d.args.first().map(String::as_str).unwrap_or_default();
        match d.name.as_str() {
            "include" if arg.ends_with("fastcgi-php.conf") => {
                split.get_or_insert_with(|| SNIPPET_SPLIT.into());
                index.get_or_insert_with(|| "index.php".into());
                notes.push(format!(
                    "{}: include {arg}: its try_files $fastcgi_script_name =404 is not converted: pinlb checks no files; php-fpm answers 404 (\"File not found.\") for a missing script itself",
                    d.at()
                ));
            }
            "fastcgi_index" => index = Some(arg.to_string()),
            "fastcgi_split_path_info" => split = Some(arg.to_string()),
            "fastcgi_param" => {
                param(d, &mut params)?;
                if arg == "PATH_INFO" {
                    notes.push(format!("{}: fastcgi_param PATH_INFO: pinlb sends PATH_INFO only when the split gives one (nginx sends it empty)", d.at()));
                }
            }
            "try_files" => {
                let script_or_404 = matches!(
                    d.args.as_slice(),
                    [a, b] if (a == "$fastcgi_script_name" || a == "$uri") && b == "=404"
                );
                if !script_or_404 {
                    return Err(format!(
                        "{}: try_files not converted: in a FastCGI location only try_files $fastcgi_script_name =404 converts (pinlb checks no files)",
                        d.at()
                    ));
                }
                notes.push(format!(
                    "{}: try_files not converted: pinlb checks no files; php-fpm answers 404 (\"File not found.\") for a missing script itself",
                    d.at()
                ));
            }
            _ => {}
        }
    }
    let Some(root) = root else {
        return Err("no root in force: nginx's $document_root would be its compiled-in html directory; write root in the location or server".into());
    };
    if root.contains('$') || !root.starts_with('/') {
        return Err(format!(
            "root {root} is not an absolute path without variables, which fastcgi.root needs"
        ));
    }
    let root = match root.trim_end_matches('/') {
        "" => "/",
        r => r,
    };
    if let Some(s) = &split
        && regex::bytes::Regex::new(s).map(|r| r.captures_len()) != Ok(3)
    {
        return Err(format!(
            "fastcgi_split_path_info {s}: not a regular expression with two capture groups pinlb can compile"
        ));
    }
    Ok(RawFastcgi {
        root: Some(spanned(root.into())),
        index: index.map(spanned),
        split_path_info: split.map(spanned),
        params,
        ..RawFastcgi::default()
    })
}

/// One `fastcgi_param NAME VALUE [if_not_empty]`.
fn param(d: &Directive, params: &mut BTreeMap<String, Spanned<String>>) -> Result<(), String> {
    let (Some(name), Some(value)) = (d.args.first(), d.args.get(1)) else {
        return Err(format!(
            "{}: fastcgi_param not converted: expected a name and a value",
            d.at()
        ));
    };
    let standard = STANDARD
        .iter()
        .any(|(n, values)| n == name && values.contains(&value.as_str()));
    if standard {
        return Ok(());
    }
    if value.contains('$') {
        let var = value[value.find('$').unwrap_or(0)..]
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$'))
            .next()
            .unwrap_or(value);
        return Err(format!(
            "{}: fastcgi_param {name} {value} not converted: pinlb's params are fixed strings, and {var} is a variable",
            d.at()
        ));
    }
    if pinlb_sets(name) {
        return Err(format!(
            "{}: fastcgi_param {name} {value} not converted: pinlb sets {name} itself, from the request",
            d.at()
        ));
    }
    if d.args.len() > 2 {
        return Err(format!(
            "{}: fastcgi_param {name} not converted: {} has no pinlb equivalent",
            d.at(),
            d.args[2..].join(" ")
        ));
    }
    params.insert(name.clone(), spanned(value.clone()));
    Ok(())
}

/// A `location` that only `try_files … /SCRIPT.php?$query_string` (the front controller's
/// usual `location / { try_files $uri $uri/ /index.php?$query_string; }`): the script its
/// requests end in when no file is found. pinlb serves no files, so it becomes a route to the
/// FastCGI upstream with `script = SCRIPT` (every path runs it).
pub(super) fn front_controller(l: &Directive) -> Option<String> {
    let [path] = l.args.as_slice() else {
        return None;
    };
    let block = l.block.as_deref()?;
    if !path.starts_with('/') || block.len() != 1 || block[0].name != "try_files" {
        return None;
    }
    let last = block[0].args.last()?;
    let script = ["?$query_string", "?$args", "$is_args$args"]
        .iter()
        .find_map(|q| last.strip_suffix(q))?;
    (script.starts_with('/') && script.ends_with(".php") && !script.contains('$'))
        .then(|| script.to_string())
}

/// `fastcgi_pass`'s address as a backend's (`unix:/path` checked as pinlb takes it), or
/// `None` for an upstream block's name.
pub(super) fn backend(address: &str) -> Result<Option<String>, String> {
    if address.starts_with("unix:") {
        return super::unix_socket::server_address(address).map(Some);
    }
    if address.contains('$') {
        return Err("an address named by variables is not one pinlb can connect to".into());
    }
    let with_port = address.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && port.chars().all(|c| c.is_ascii_digit()) && !port.is_empty()
    });
    Ok(with_port.then(|| address.to_string()))
}

/// The name of the upstream for `base` with `fastcgi` as its table: `base` itself when there
/// is none of that name yet or it has the same table, else `base#2`, `base#3`, ... (one per
/// distinct table; an HTTP upstream of the name is passed over too).
pub(super) fn upstream_name(
    base: &str,
    fastcgi: &RawFastcgi,
    upstreams: &BTreeMap<String, RawUpstream>,
) -> String {
    for n in 1.. {
        let name = match n {
            1 => base.to_string(),
            n => format!("{base}#{n}"),
        };
        match upstreams
            .get(&name)
            .map(|u| u.fastcgi.as_ref().map(Spanned::get_ref))
        {
            None => return name,
            Some(Some(t)) if t == fastcgi => return name,
            Some(_) => continue,
        }
    }
    base.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(name: &str, args: &[&str]) -> Directive {
        Directive {
            name: name.into(),
            args: args.iter().map(|a| a.to_string()).collect(),
            block: None,
            file: "n.conf".into(),
            line: 3,
        }
    }

    #[test]
    fn the_debian_snippet_and_standard_params_make_the_usual_table() {
        let mut notes = Vec::new();
        let block = [
            d("include", &["snippets/fastcgi-php.conf"]),
            d("include", &["fastcgi_params"]),
            d(
                "fastcgi_param",
                &["SCRIPT_FILENAME", "$document_root$fastcgi_script_name"],
            ),
            d("fastcgi_param", &["APP_ENV", "prod"]),
            d("fastcgi_pass", &["unix:/run/php/php8.2-fpm.sock"]),
        ];
        let t = table(&block, Some("/var/www/html/"), &mut notes).unwrap();
        let text = |v: &Option<Spanned<String>>| v.as_ref().map(|v| v.get_ref().clone());
        assert_eq!(text(&t.root).as_deref(), Some("/var/www/html"));
        assert_eq!(text(&t.index).as_deref(), Some("index.php"));
        assert_eq!(text(&t.split_path_info).as_deref(), Some(SNIPPET_SPLIT));
        assert_eq!(t.params["APP_ENV"].get_ref(), "prod");
        assert!(notes[0].contains("php-fpm answers 404"), "{notes:?}");
    }

    #[test]
    fn a_variable_or_a_name_pinlb_sets_is_refused_naming_it() {
        let mut notes = Vec::new();
        let e = table(
            &[d("fastcgi_param", &["APP_USER", "$cookie_user"])],
            Some("/w"),
            &mut notes,
        )
        .unwrap_err();
        assert!(
            e.starts_with("n.conf:3: fastcgi_param APP_USER $cookie_user not converted")
                && e.contains("$cookie_user is a variable"),
            "{e}"
        );
        let e = table(
            &[d("fastcgi_param", &["SCRIPT_FILENAME", "/srv/app.php"])],
            Some("/w"),
            &mut notes,
        )
        .unwrap_err();
        assert!(e.contains("pinlb sets SCRIPT_FILENAME itself"), "{e}");
        assert!(
            table(&[], None, &mut notes)
                .unwrap_err()
                .contains("no root")
        );
    }

    #[test]
    fn addresses_and_names_of_fastcgi_pass() {
        assert_eq!(backend("127.0.0.1:9000"), Ok(Some("127.0.0.1:9000".into())));
        assert_eq!(
            backend("unix:/run/php.sock"),
            Ok(Some("unix:/run/php.sock".into()))
        );
        assert_eq!(backend("php"), Ok(None));
        assert!(backend("unix:php.sock").is_err());
        let mut ups = BTreeMap::new();
        let one = RawFastcgi {
            root: Some(spanned("/a".into())),
            ..RawFastcgi::default()
        };
        let up = RawUpstream {
            fastcgi: Some(spanned(one.clone())),
            ..RawUpstream::default()
        };
        ups.insert("php".to_string(), up);
        assert_eq!(upstream_name("php", &one, &ups), "php");
        let mut other = one.clone();
        other.root = Some(spanned("/b".into()));
        assert_eq!(upstream_name("php", &other, &ups), "php#2");
    }
}

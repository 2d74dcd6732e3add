//! `fastcgi_pass` locations, which `pinlb import` does not convert yet: their usual shape is a
//! regex location (`location ~ \.php$ { … fastcgi_pass …; }`) beside a `location /` that serves
//! files or `try_files` them to `/index.php`, and pinlb has neither regex routes nor files to
//! serve. Such a location is refused with what to write instead: an upstream with
//! `protocol = "fastcgi"` and its `[upstream.NAME.fastcgi]` table (`root`, `index`,
//! `split_path_info`, `script` for a front controller).

use super::parse::Directive;

/// Why a location with `fastcgi_pass` is not converted, and what to write by hand.
pub(super) const NOT_CONVERTED: &str = "a regex location with fastcgi_pass is not converted (pinlb routes match prefixes, and serve no files); write an upstream with protocol = \"fastcgi\", the fastcgi_pass address as its backend and [upstream.NAME.fastcgi] root = the server's root (script = \"/index.php\" for a try_files front controller), and route the PHP paths to it (docs/configuration.md, [upstream.NAME.fastcgi])";

/// Whether a location's block passes requests to a FastCGI server.
pub(super) fn passes(block: &[Directive]) -> bool {
    block.iter().any(|d| d.name == "fastcgi_pass")
}

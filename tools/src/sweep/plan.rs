//! Which layouts fit the cores, and where the load generator runs.

use serde::Serialize;

use pinlb::sys::cpus::format_cpu_list;

/// One split of the cores: a backend alone, or a proxy in front of backends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Short and stable, for JSON and file names: `direct`, `p1b3`.
    pub id: String,
    /// For people: "direct (1 backend)", "1 proxy core + 3 backends".
    pub name: String,
    /// The proxy's cores, one worker each; empty for direct.
    pub proxy: Vec<usize>,
    /// The core of each backend process.
    pub backends: Vec<usize>,
}

impl Layout {
    fn direct(core: usize) -> Layout {
        Layout {
            id: "direct".into(),
            name: "direct (1 backend)".into(),
            proxy: Vec::new(),
            backends: vec![core],
        }
    }

    fn proxied(proxy: Vec<usize>, backends: Vec<usize>) -> Layout {
        let (p, b) = (proxy.len(), backends.len());
        Layout {
            id: format!("p{p}b{b}"),
            name: format!(
                "{p} proxy core{} + {b} backend{}",
                if p == 1 { "" } else { "s" },
                if b == 1 { "" } else { "s" }
            ),
            proxy,
            backends,
        }
    }

    fn cores(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.proxy.iter().chain(&self.backends).copied().collect();
        c.sort_unstable();
        c.dedup();
        c
    }
}

/// The layouts to measure on some cores, and where the load generator runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub layouts: Vec<Layout>,
    /// The load generator's cores.
    pub load: Vec<usize>,
    /// What shares a core, said plainly; empty when nothing does.
    pub notes: Vec<String>,
}

/// Lays out `cores`. With three or more, the load generator gets the last quarter of them (at
/// least one) to itself and the layouts split the rest: direct (one backend on the first), and
/// for every p from 1 to all but one, p proxy cores followed by one backend on each core left.
/// With fewer there is no core to spare: the layouts use every core and the load generator
/// runs on the last one beside them, which the notes say.
pub fn plan(cores: &[usize]) -> Plan {
    let n = cores.len();
    let mut notes = Vec::new();
    let (app, load) = if n >= 3 {
        let l = (n / 4).max(1);
        (cores[..n - l].to_vec(), cores[n - l..].to_vec())
    } else {
        (cores.to_vec(), vec![cores[n - 1]])
    };
    let mut layouts = vec![Layout::direct(app[0])];
    if app.len() == 1 {
        layouts.push(Layout::proxied(vec![app[0]], vec![app[0]]));
        notes.push(format!(
            "only core {} is available: the proxy, the backend and the load generator all share it, so the numbers show contention more than capacity",
            app[0]
        ));
    } else {
        for p in 1..app.len() {
            layouts.push(Layout::proxied(app[..p].to_vec(), app[p..].to_vec()));
        }
    }
    if n == 2 {
        let shared: Vec<&str> = layouts
            .iter()
            .filter(|l| l.cores().iter().any(|c| load.contains(c)))
            .map(|l| l.name.as_str())
            .collect();
        notes.push(format!(
            "only 2 cores: the load generator shares core {} with {}; the CPU it uses there is taken from what it measures, so those layouts are understated (with 3 cores or more it gets one to itself)",
            format_cpu_list(&load),
            shared.join(", ")
        ));
    }
    Plan {
        layouts,
        load,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(p: &Plan) -> Vec<&str> {
        p.layouts.iter().map(|l| l.id.as_str()).collect()
    }

    #[test]
    fn one_core_shares_everything_and_says_so() {
        let p = plan(&[3]);
        assert_eq!(ids(&p), ["direct", "p1b1"]);
        assert_eq!(p.load, [3]);
        assert_eq!(p.layouts[1].proxy, [3]);
        assert_eq!(p.layouts[1].backends, [3]);
        assert!(p.notes[0].contains("all share it"), "{:?}", p.notes);
    }

    #[test]
    fn two_cores_split_between_proxy_and_backend_and_the_load_generator_shares_a_core() {
        let p = plan(&[0, 1]);
        assert_eq!(ids(&p), ["direct", "p1b1"]);
        assert_eq!(p.layouts[0].backends, [0]);
        assert_eq!(
            (&p.layouts[1].proxy[..], &p.layouts[1].backends[..]),
            (&[0][..], &[1][..])
        );
        assert_eq!(p.load, [1]);
        assert_eq!(p.notes.len(), 1);
        assert!(
            p.notes[0].contains("shares core 1 with 1 proxy core + 1 backend")
                && !p.notes[0].contains("direct"),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn four_cores_give_the_load_generator_one_and_split_the_other_three() {
        let p = plan(&[0, 1, 2, 3]);
        assert_eq!(ids(&p), ["direct", "p1b2", "p2b1"]);
        assert_eq!(p.load, [3]);
        assert!(p.notes.is_empty());
        assert_eq!(p.layouts[1].proxy, [0]);
        assert_eq!(p.layouts[1].backends, [1, 2]);
        assert_eq!(p.layouts[2].proxy, [0, 1]);
        assert_eq!(p.layouts[2].backends, [2]);
        assert_eq!(p.layouts[1].name, "1 proxy core + 2 backends");
        assert_eq!(p.layouts[2].name, "2 proxy cores + 1 backend");
    }

    #[test]
    fn eight_cores_give_the_load_generator_two() {
        let p = plan(&[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(p.load, [6, 7]);
        assert_eq!(ids(&p), ["direct", "p1b5", "p2b4", "p3b3", "p4b2", "p5b1"]);
        for l in &p.layouts {
            assert!(l.cores().iter().all(|c| *c < 6), "{l:?}");
        }
        assert!(p.notes.is_empty());
    }
}

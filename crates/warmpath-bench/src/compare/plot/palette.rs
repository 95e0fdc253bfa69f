//! Series styles: each router strategy a solid colour of its own, each
//! offline reference a dashed line in a colour no strategy uses, so no two
//! legend entries look alike.

/// Strategies, solid (Tableau's ten less the grey and olive the references
/// take): more than the router's strategies.
const ROUTERS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// References, dashed: dark and muted, unlike every router colour.
const REFERENCES: [&str; 5] = ["#000000", "#7f7f7f", "#bcbd22", "#00525e", "#c49c94"];

/// Dash patterns of the references, one each.
const DASHES: [&str; 5] = ["8 4", "3 3", "12 3 3 3", "1 3", "6 2 1 2"];

/// How a series is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Style {
    pub(crate) color: &'static str,
    /// `stroke-dasharray`; `None` draws solid.
    pub(crate) dash: Option<&'static str>,
}

/// The style of strategy `k` (report order, the same in every chart).
pub(crate) fn router(k: usize) -> Style {
    Style {
        color: ROUTERS[k % ROUTERS.len()],
        dash: None,
    }
}

/// The style of reference line `k`.
pub(crate) fn reference(k: usize) -> Style {
    Style {
        color: REFERENCES[k % REFERENCES.len()],
        dash: Some(DASHES[k % DASHES.len()]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn the_palettes_are_distinct_and_cover_every_series() {
        let all: BTreeSet<&str> = ROUTERS.iter().chain(&REFERENCES).copied().collect();
        assert_eq!(all.len(), ROUTERS.len() + REFERENCES.len());
        assert!(ROUTERS.len() >= warmpath_core::Strategy::ALL.len());
        // Four references are drawn today (bound, reference, two LRU ones),
        // plus room for the ceiling.
        assert!(REFERENCES.len() >= 5 && DASHES.len() >= REFERENCES.len());
        assert_eq!(DASHES.iter().collect::<BTreeSet<_>>().len(), DASHES.len());
    }
}

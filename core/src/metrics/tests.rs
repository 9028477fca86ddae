//! Registry tests: slot numbering, void series, claims, exposition order
//! and presence, dynamic families and their cap, build-time checks.

use super::slab::bucket_index;
use super::*;

fn small() -> (Registry, CounterVec, GaugeVec, HistogramVec) {
    let mut b = Registry::builder();
    let c = b.counter_vec(
        "c_total",
        "C.",
        &["seg", "kind"],
        &[&["b", "a"], &["x", "y", "z"]],
    );
    let g = b.gauge("g", "G.");
    let h = b.histogram("h_seconds", "H.", &[0.5, 1.0]);
    (b.build(2), c, g, h)
}

#[test]
fn mixed_radix_slots() {
    let (_, c, _, h) = small();
    assert_eq!(c.len(), 6);
    let at = |i: &[usize]| c.at(i).map(|id| (id.slot.series, id.slot.cell));
    assert_eq!(at(&[0, 0]), Some((0, 0)));
    assert_eq!(at(&[0, 2]), Some((2, 2)));
    assert_eq!(at(&[1, 0]), Some((3, 3)));
    assert_eq!(at(&[1, 2]), Some((5, 5)));
    assert_eq!(at(&[2, 0]), None);
    assert_eq!(at(&[0, 3]), None);
    assert_eq!(at(&[0]), None);
    // The histogram comes after the counter (6 cells) and the gauge (1):
    // 2 bounds + Inf + sum = 4 cells.
    let hid = h.single().unwrap();
    assert_eq!((hid.slot.series, hid.slot.cell), (7, 7));
}

#[test]
fn void_series_ignore_updates() {
    let (reg, c, g, h) = small();
    let core = reg.claim(0).unwrap();
    let void = c.series(&[9, 9]);
    core.counter(void).inc();
    core.counter(void).add(0);
    reg.counter(void).inc();
    core.gauge(g.series(&[1])).inc();
    let hv = h.series(&[0]);
    core.histogram(hv).observe(1.0);
    reg.histogram(hv).observe(1.0);
    assert_eq!(reg.histogram_value(hv), (0, 0.0));
    assert_eq!(reg.counter_value(void), 0);
    assert_eq!(reg.render_to_string(), "");
    assert_eq!(c.series(&[1, 1]), c.at(&[1, 1]).unwrap());
}

#[test]
fn claims_are_exclusive_and_released() {
    let (reg, ..) = small();
    let a = reg.claim(0).unwrap();
    assert!(reg.claim(0).is_none());
    assert!(reg.claim(2).is_none());
    let b = reg.claim(1).unwrap();
    assert_eq!((a.index(), b.index()), (0, 1));
    drop(a);
    assert!(reg.claim(0).is_some());
}

#[test]
fn series_order_and_presence() {
    let (reg, c, g, h) = small();
    let core = reg.claim(0).unwrap();
    core.counter(c.at(&[0, 1]).unwrap()).inc(); // seg=b kind=y
    core.counter(c.at(&[1, 2]).unwrap()).add(0); // seg=a kind=z, touched at 0
    core.counter(c.at(&[1, 0]).unwrap()).add(2); // seg=a kind=x
    let text = reg.render_to_string();
    assert_eq!(
        text,
        "# HELP c_total C.\n# TYPE c_total counter\n\
             c_total{kind=\"x\",seg=\"a\"} 2\n\
             c_total{kind=\"y\",seg=\"b\"} 1\n\
             c_total{kind=\"z\",seg=\"a\"} 0\n"
    );
    reg.gauge(g.single().unwrap()).set(5.0);
    core.gauge(g.single().unwrap()).dec();
    core.histogram(h.single().unwrap()).observe(0.7);
    let text = reg.render_to_string();
    assert!(text.contains("# TYPE g gauge\ng 4\n"), "{text}");
    assert!(
        text.contains(
            "h_seconds_bucket{le=\"0.5\"} 0\nh_seconds_bucket{le=\"1\"} 1\n\
                 h_seconds_bucket{le=\"+Inf\"} 1\nh_seconds_sum 0.7\nh_seconds_count 1\n"
        ),
        "{text}"
    );
    assert_eq!(reg.histogram_value(h.single().unwrap()), (1, 0.7));
}

#[test]
fn dynamic_families_sort_and_cap() {
    let mut b = Registry::builder();
    let d = b.dynamic_counter_vec("d_total", "D.", &["z", "a"]);
    let dh = b.dynamic_histogram_vec("dh", "DH.", &[1.0], &["code"]);
    let reg = b.build(0);
    assert_eq!(reg.render_to_string(), "", "no series, no family");
    reg.dynamic_counter_add(d, &["1", "b"], 1);
    reg.dynamic_counter_add(d, &["2", "a"], 3);
    reg.dynamic_counter_add(d, &["1", "b"], 1);
    reg.dynamic_counter_add(d, &["wrong arity"], 1);
    reg.dynamic_histogram_observe(dh, &["200"], 0.5);
    assert_eq!(
        reg.render_to_string(),
        "# HELP d_total D.\n# TYPE d_total counter\n\
             d_total{a=\"a\",z=\"2\"} 3\nd_total{a=\"b\",z=\"1\"} 2\n\
             # HELP dh DH.\n# TYPE dh histogram\n\
             dh_bucket{code=\"200\",le=\"1\"} 1\ndh_bucket{code=\"200\",le=\"+Inf\"} 1\n\
             dh_sum{code=\"200\"} 0.5\ndh_count{code=\"200\"} 1\n"
    );
    for i in 0..DYNAMIC_SERIES_LIMIT + 10 {
        reg.dynamic_counter_add(d, &["x", &i.to_string()], 1);
    }
    let lines = reg
        .render_to_string()
        .lines()
        .filter(|l| l.starts_with("d_total"))
        .count();
    assert_eq!(lines, DYNAMIC_SERIES_LIMIT);
}

#[test]
#[should_panic(expected = "invalid metric name")]
fn bad_names_are_caught_at_build() {
    Registry::builder().counter("bad-name", "");
}

#[test]
#[should_panic(expected = "strictly increasing")]
fn bad_buckets_are_caught_at_build() {
    Registry::builder().histogram("h", "", &[1.0, 1.0]);
}

#[test]
fn nan_goes_to_inf_bucket() {
    assert_eq!(bucket_index(&[1.0, 2.0], f64::NAN), 2);
    assert_eq!(bucket_index(&[1.0, 2.0], 1.0), 0);
    assert_eq!(bucket_index(&[1.0, 2.0], 1.5), 1);
    assert_eq!(bucket_index(&[], 1.5), 0);
}

#[test]
fn merged_render_labels_each_part_and_writes_families_once() {
    let build = |with_own: bool| {
        let mut b = Registry::builder();
        let c = b.counter_vec("m_total", "Help.", &["code"], &[&["a", "b"]]);
        let own = with_own.then(|| b.gauge("aa_process", "Own."));
        let dynamic = b.dynamic_counter_vec("z_total", "Dyn.", &["reason"]);
        (b.build(1), c, own, dynamic)
    };
    let (main, _, own, _) = build(true);
    main.gauge(own.unwrap().series(&[])).set(3.0);
    let (x, cx, _, dx) = build(false);
    let (y, cy, _, _) = build(false);
    x.counter(cx.series(&[1])).inc();
    x.dynamic_counter_add(dx, &["r"], 2);
    y.counter(cy.series(&[0])).add(5);
    let mut out = Vec::new();
    main.render_merged(&mut out, "cluster", &[("x", &x), ("y\"", &y)]);
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "# HELP aa_process Own.\n# TYPE aa_process gauge\naa_process 3\n\
         # HELP m_total Help.\n# TYPE m_total counter\n\
         m_total{cluster=\"x\",code=\"b\"} 1\nm_total{cluster=\"y\\\"\",code=\"a\"} 5\n\
         # HELP z_total Dyn.\n# TYPE z_total counter\nz_total{cluster=\"x\",reason=\"r\"} 2\n"
    );
    // Without parts it is the plain exposition.
    let mut plain = Vec::new();
    main.render_merged(&mut plain, "cluster", &[]);
    assert_eq!(plain, main.render_to_string().into_bytes());
}

#[test]
fn dynamic_limits_fold_into_the_overflow_series_and_remove_by_label() {
    let mut b = Registry::builder();
    let c = b.dynamic_counter_vec_limit("t_bytes_total", "Bytes.", &["agent", "dir"], 2);
    let r = b.build(1);
    r.dynamic_counter_add_or(c, &["a", "in"], Some(&["other", "in"]), 1);
    r.dynamic_counter_add_or(c, &["b", "in"], Some(&["other", "in"]), 2);
    r.dynamic_counter_add_or(c, &["c", "in"], Some(&["other", "in"]), 3);
    r.dynamic_counter_add_or(c, &["d", "in"], Some(&["other", "in"]), 4);
    r.dynamic_counter_add(c, &["e", "in"], 5);
    let text = r.render_to_string();
    assert!(
        text.contains("t_bytes_total{agent=\"a\",dir=\"in\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("t_bytes_total{agent=\"other\",dir=\"in\"} 7"),
        "{text}"
    );
    assert!(!text.contains("agent=\"e\""), "{text}");
    r.dynamic_counter_remove(c, 0, "a");
    let text = r.render_to_string();
    assert!(!text.contains("agent=\"a\""), "{text}");
    assert!(text.contains("agent=\"b\""), "{text}");
}

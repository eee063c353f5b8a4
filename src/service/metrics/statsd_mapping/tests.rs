use super::*;

const EG_MAPPING: &str = include_str!("../../../../tests/fixtures/envoy-gateway/statsd_conf.yaml");

fn mapping(yaml: &str) -> StatsdMapping {
    StatsdMapping::from_yaml(yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn refused(yaml: &str) -> String {
    match StatsdMapping::from_yaml(yaml) {
        Ok(_) => panic!("accepted:\n{yaml}"),
        Err(e) => e,
    }
}

/// (name, labels) of what `stat` becomes, `None` if dropped.
fn named(m: &StatsdMapping, stat: &str, kind: StatKind) -> Option<(String, Vec<(String, String)>)> {
    m.map(stat, kind).map(|x| (x.name, x.labels))
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn envoy_gateways_mapping_names_every_stat_upstream_sends() {
    let eg = mapping(EG_MAPPING);
    let c = StatKind::Counter;
    for suffix in [
        "total_hits",
        "over_limit",
        "near_limit",
        "within_limit",
        "shadow_mode",
    ] {
        // One key: the glob.
        let stat = format!("ratelimit.service.rate_limit.edge.user.{suffix}");
        assert_eq!(
            named(&eg, &stat, c),
            Some((
                format!("ratelimit_service_rate_limit_{suffix}"),
                labels(&[("domain", "edge"), ("key1", "user")])
            )),
            "{stat}"
        );
        // Two keys or more: the regex, which keeps the first two.
        let stat = format!("ratelimit.service.rate_limit.edge.tenant_acme.api_v1.path.{suffix}");
        assert_eq!(
            named(&eg, &stat, c),
            Some((
                format!("ratelimit_service_rate_limit_{suffix}"),
                labels(&[
                    ("domain", "edge"),
                    ("key1", "tenant_acme"),
                    ("key2", "api_v1")
                ])
            )),
            "{stat}"
        );
    }
    assert_eq!(
        named(&eg, "ratelimit_server.ShouldRateLimit.total_requests", c),
        Some((
            "ratelimit_service_total_requests".into(),
            labels(&[("grpc_method", "ShouldRateLimit")])
        ))
    );
    assert_eq!(
        named(&eg, "ratelimit.service.config_load_success", c),
        Some(("ratelimit_service_config_load_success".into(), vec![]))
    );
    assert_eq!(
        named(
            &eg,
            "ratelimit.service.call.should_rate_limit.redis_error",
            c
        ),
        Some((
            "ratelimit_service_should_rate_limit_error".into(),
            labels(&[("err_type", "redis_error")])
        ))
    );
    // The timer: a histogram on Prometheus' default buckets, not scaled (Envoy Gateway
    // dropped upstream's `scale: 0.001`).
    let rt = eg
        .map(
            "ratelimit_server.ShouldRateLimit.response_time",
            StatKind::Observer,
        )
        .unwrap();
    assert_eq!(rt.name, "ratelimit_service_response_time_seconds");
    assert_eq!(rt.timer, &Timer::Histogram(DEFAULT_BUCKETS.to_vec()));
    assert_eq!(rt.scale, None);
    // `match_metric_type: counter`: a timer of that name is not mapped by it.
    assert_eq!(
        named(
            &eg,
            "ratelimit_server.ShouldRateLimit.total_requests",
            StatKind::Observer
        ),
        Some((
            "ratelimit_server_ShouldRateLimit_total_requests".into(),
            vec![]
        ))
    );
}

#[test]
fn upstreams_default_differs_from_envoy_gateways_by_the_response_time_scale() {
    let rt = "ratelimit_server.ShouldRateLimit.response_time";
    let seconds = StatsdMapping::upstream_default(false);
    let mapped = seconds.map(rt, StatKind::Observer).unwrap();
    assert_eq!(mapped.scale, Some(0.001));
    assert_eq!(mapped.name, "ratelimit_service_response_time_seconds");
    // PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS: the scale line removed, as upstream does.
    let ms = StatsdMapping::upstream_default(true);
    assert_eq!(ms.map(rt, StatKind::Observer).unwrap().scale, None);
    // Everything else is the same in all three.
    let eg = mapping(EG_MAPPING);
    for stat in [
        "ratelimit.service.rate_limit.d.k_v.over_limit",
        "ratelimit.service.rate_limit.d.a.b.c.shadow_mode",
        "ratelimit_server.ShouldRateLimit.total_requests",
        "ratelimit.service.config_load_error",
        "something.else",
    ] {
        let want = named(&eg, stat, StatKind::Counter);
        assert_eq!(named(&seconds, stat, StatKind::Counter), want, "{stat}");
        assert_eq!(named(&ms, stat, StatKind::Counter), want, "{stat}");
    }
    let mut eg_rt = eg.map(rt, StatKind::Observer).unwrap();
    eg_rt.scale = Some(0.001);
    assert_eq!(mapped, eg_rt);
}

#[test]
fn globs_are_tried_before_regexes_wherever_they_stand() {
    let m = mapping(
        r#"
mappings:
  - match: "a\\.(.*)"
    match_type: regex
    name: "regex_$1"
  - match: "a.*"
    name: "glob_$1"
"#,
    );
    assert_eq!(named(&m, "a.b", StatKind::Counter).unwrap().0, "glob_b");
    // The regex is unanchored and takes what the glob does not.
    assert_eq!(
        named(&m, "x.a.b.c", StatKind::Counter).unwrap().0,
        "regex_b_c"
    );
}

#[test]
fn the_first_glob_in_the_file_wins_unless_ordering_is_disabled() {
    let yaml = |disable: bool| {
        format!(
            r#"
defaults:
  glob_disable_ordering: {disable}
mappings:
  - match: "a.*.c"
    name: first
  - match: "a.b.*"
    name: second
"#
        )
    };
    let ordered = mapping(&yaml(false));
    assert_eq!(
        named(&ordered, "a.b.c", StatKind::Counter).unwrap().0,
        "first"
    );
    // Unordered, the leftmost literal wins.
    let unordered = mapping(&yaml(true));
    assert_eq!(
        named(&unordered, "a.b.c", StatKind::Counter).unwrap().0,
        "second"
    );
    assert_eq!(
        named(&unordered, "a.x.c", StatKind::Counter).unwrap().0,
        "first"
    );
}

#[test]
fn a_glob_hidden_by_an_earlier_one_is_refused() {
    let e = refused(
        r#"
mappings:
  - match: "a.*"
    name: any
  - match: "a.b"
    name: b
"#,
    );
    assert!(
        e.contains("mapping 2 (\"a.b\")") && e.contains("mapping 1 (\"a.*\")"),
        "{e}"
    );
    // The specific one first is fine, and so are globs for different kinds of stat.
    mapping("mappings:\n  - {match: a.b, name: b}\n  - {match: \"a.*\", name: any}\n");
    mapping(
        "mappings:\n  - {match: \"a.*\", name: c, match_metric_type: counter}\n  - {match: a.b, name: t, match_metric_type: observer}\n",
    );
    // Unordered, only a repeated glob is.
    let e = refused(
        "defaults: {glob_disable_ordering: true}\nmappings:\n  - {match: \"a.*\", name: x}\n  - {match: \"a.*\", name: y}\n",
    );
    assert!(e.contains("mapping 2"), "{e}");
    mapping("defaults: {glob_disable_ordering: true}\nmappings:\n  - {match: \"a.*\", name: x}\n  - {match: a.b, name: y}\n");
}

#[test]
fn match_metric_type_selects_the_kind_of_stat() {
    let m = mapping(
        r#"
mappings:
  - match: "x.*"
    match_metric_type: observer
    name: timer_$1
  - match: "x\\.(.*)"
    match_type: regex
    match_metric_type: gauge
    name: gauge_$1
"#,
    );
    assert_eq!(named(&m, "x.y", StatKind::Observer).unwrap().0, "timer_y");
    assert_eq!(named(&m, "x.y", StatKind::Gauge).unwrap().0, "gauge_y");
    assert_eq!(named(&m, "x.y", StatKind::Counter).unwrap().0, "x_y");
}

#[test]
fn templates_fill_from_captures_as_statsd_exporter_does() {
    let m = mapping(
        r#"
mappings:
  - match: "svc.*.*"
    name: "svc_${2}_total"
    labels:
      instance: "$1-$3"
      literal: "fixed"
  - match: "re\\.(?P<first>\\w+)\\.(\\w+)"
    match_type: regex
    name: "re_${2}"
    labels:
      named: "$first"
      joined: "$1x"
      dollar: "$$1"
"#,
    );
    assert_eq!(
        named(&m, "svc.a.b", StatKind::Counter),
        Some((
            "svc_b_total".into(),
            labels(&[("instance", "a-"), ("literal", "fixed")])
        ))
    );
    // Regexes fill as Go's Expand does: names, the longest name after `$`, `$$`.
    assert_eq!(
        named(&m, "re.one.two", StatKind::Counter),
        Some((
            "re_two".into(),
            labels(&[("dollar", "$1"), ("joined", ""), ("named", "one")])
        ))
    );
    // A filled name is escaped; one that comes out empty is dropped.
    let m = mapping("mappings:\n  - {match: \"*.x\", name: \"$1\"}\n");
    assert_eq!(named(&m, "5xx.x", StatKind::Counter).unwrap().0, "_5xx");
    assert_eq!(named(&m, ".x", StatKind::Counter), None);
}

#[test]
fn drop_scale_help_and_timers_are_the_mappings() {
    let m = mapping(
        r#"
defaults:
  timer_type: histogram
  buckets: [1, 2]
mappings:
  - match: "noise.*"
    action: drop
    name: dropped
  - match: "t.own"
    name: own
    scale: 0.5
    help: "Own buckets"
    histogram_options:
      buckets: [0.1, 0.2, .inf]
  - match: "t.summary"
    name: summ
    observer_type: summary
    timer_type: histogram
  - match: "t.legacy"
    name: legacy
    buckets: [3]
"#,
    );
    assert_eq!(m.map("noise.x", StatKind::Counter), None);
    let own = m.map("t.own", StatKind::Observer).unwrap();
    assert_eq!(own.timer, &Timer::Histogram(vec![0.1, 0.2]));
    assert_eq!(own.help, Some("Own buckets"));
    assert_eq!(own.scaled(3.0), 1.5);
    // observer_type wins over timer_type.
    assert_eq!(
        m.map("t.summary", StatKind::Observer).unwrap().timer,
        &Timer::Summary
    );
    assert_eq!(
        m.map("t.legacy", StatKind::Observer).unwrap().timer,
        &Timer::Histogram(vec![3.0])
    );
    // Unmapped: the defaults' timer; statsd_exporter's default is a summary.
    assert_eq!(
        m.map("other", StatKind::Observer).unwrap().timer,
        &Timer::Histogram(vec![1.0, 2.0])
    );
    let plain = mapping("");
    assert_eq!(
        plain.map("a.b", StatKind::Observer).unwrap().timer,
        &Timer::Summary
    );
    assert_eq!(
        named(&plain, "a.b-c", StatKind::Counter).unwrap().0,
        "a_b_c"
    );
    let h = mapping("defaults: {observer_type: histogram}\n");
    assert_eq!(
        h.map("x", StatKind::Observer).unwrap().timer,
        &Timer::Histogram(DEFAULT_BUCKETS.to_vec())
    );
}

#[test]
fn what_shardgate_does_not_do_is_refused_by_name() {
    for (yaml, named) in [
        ("mappings:\n  - {match: a.b, name: x, ttl: 1m}\n", "`ttl`"),
        ("mappings:\n  - {match: a.b, name: x, honor_labels: true}\n", "`honor_labels`"),
        (
            "mappings:\n  - {match: a.b, name: x, summary_options: {max_age: 1m}}\n",
            "`summary_options`",
        ),
        ("mappings:\n  - {match: a.b, name: x, quantiles: []}\n", "`quantiles`"),
        (
            "mappings:\n  - {match: a.b, name: x, timer_type: histogram, histogram_options: {native_histogram_max_buckets: 10}}\n",
            "native_histogram_max_buckets",
        ),
        ("defaults: {ttl: 1m}\n", "`ttl`"),
        ("defaults: {summary_options: {}}\n", "`summary_options`"),
        ("defaults: {quantiles: []}\n", "`quantiles`"),
        (
            "defaults: {histogram_options: {native_histogram_bucket_factor: 1.1}}\n",
            "native_histogram_bucket_factor",
        ),
        // Keys statsd_exporter does not know either.
        ("mappings:\n  - {match: a.b, name: x, colour: red}\n", "colour"),
        ("defaults: {colour: red}\n", "colour"),
        ("mapping: []\n", "mapping"),
    ] {
        let e = refused(yaml);
        assert!(e.contains(named), "{named} not in {e:?}");
        assert!(e.len() < 200, "short: {e}");
    }
}

#[test]
fn bad_values_are_refused_with_the_mapping_named() {
    for (yaml, named) in [
        ("mappings:\n  - {match: a.b}\n", "mapping 1 (\"a.b\"): name \"\""),
        ("mappings:\n  - {match: a.b, name: a.b}\n", "name \"a.b\""),
        ("mappings:\n  - {match: \"a.b*\", name: x}\n", "not a glob"),
        (
            "mappings:\n  - {match: \"(\", match_type: regex, name: x}\n",
            "not a regular expression: unclosed group",
        ),
        ("mappings:\n  - {match: a.b, name: x, match_type: exact}\n", "match_type \"exact\""),
        ("mappings:\n  - {match: a.b, name: x, timer_type: gauge}\n", "timer_type \"gauge\""),
        ("mappings:\n  - {match: a.b, name: x, match_metric_type: timer}\n", "match_metric_type \"timer\""),
        ("mappings:\n  - {match: a.b, name: x, action: keep}\n", "action \"keep\""),
        ("mappings:\n  - {match: a.b, name: x, scale: 0}\n", "scale 0"),
        ("mappings:\n  - {match: a.b, name: x, scale: -1}\n", "scale -1"),
        ("mappings:\n  - {match: a.b, name: x, labels: {k: v}}\n", "label \"k\""),
        ("mappings:\n  - {match: a.b, name: x, timer_type: histogram, labels: {le: v}}\n", "`le`"),
        (
            "mappings:\n  - {match: a.b, name: x, timer_type: histogram, buckets: [2, 1]}\n",
            "increasing",
        ),
        (
            "mappings:\n  - {match: a.b, name: x, timer_type: histogram, buckets: [1], histogram_options: {buckets: [2]}}\n",
            "both set",
        ),
        ("mappings:\n  - {match: a.b, name: x, buckets: [1]}\n", "summary"),
        ("defaults: {match_type: fuzzy}\n", "defaults: match_type \"fuzzy\""),
        ("defaults: {buckets: [.nan]}\n", "finite"),
        ("mappings: {match: a.b}\n", "line 1"),
    ] {
        let e = refused(yaml);
        assert!(e.contains(named), "{named} not in {e:?}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn statsd_exporters_empty_spellings_keep_their_meaning() {
    // `match_type: ""` is glob even under regex defaults; `timer_type: ""` a summary;
    // `action: ""` maps.
    let m = mapping(
        "defaults: {match_type: regex, timer_type: histogram}\nmappings:\n  - {match: \"a.*\", match_type: \"\", name: g, timer_type: \"\", action: \"\"}\n",
    );
    let g = m.map("a.b", StatKind::Observer).unwrap();
    assert_eq!((g.name.as_str(), g.timer), ("g", &Timer::Summary));
}

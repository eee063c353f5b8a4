//! A domain's `rlqs:` section: how an RLQS bucket id (Envoy's `rate_limit_quota` filter
//! names a bucket by a map of strings) becomes a descriptor of the domain, whose rule then
//! limits it. Owns only that mapping; what is assigned to the bucket is the service's.
//!
//! Without the section a bucket id's entries, sorted by key, are the descriptor, so a
//! one-entry id `{tenant: acme}` is `tenant=acme` and rule files serve RLQS unchanged.
//! With `rlqs: {keys: [tenant, plan]}` the descriptor is those keys, in that order, each
//! with the bucket id's value; keys the list does not name are dropped (two bucket ids
//! differing only in them share the rule's one bucket), and a listed key the bucket id
//! does not carry is left out.

/// The most keys `rlqs.keys` may list: as many entries as a bucket id may carry.
pub const MAX_RLQS_KEYS: usize = 16;

/// The descriptor of a bucket id's `entries` (sorted by key), under a domain's `rlqs.keys`
/// (`None`: no section).
pub fn descriptor_of(
    keys: Option<&[String]>,
    entries: &[(String, String)],
) -> Vec<(String, String)> {
    let Some(keys) = keys else {
        let mut sorted = entries.to_vec();
        sorted.sort();
        return sorted;
    };
    keys.iter()
        .filter_map(|k| {
            let (_, value) = entries.iter().find(|(key, _)| key == k)?;
            Some((k.clone(), value.clone()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::descriptor_of;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn without_a_section_the_entries_sorted_by_key_are_the_descriptor() {
        let id = pairs(&[("tenant", "acme"), ("plan", "gold")]);
        assert_eq!(
            descriptor_of(None, &id),
            pairs(&[("plan", "gold"), ("tenant", "acme")])
        );
    }

    #[test]
    fn the_listed_keys_in_their_order_and_nothing_else() {
        let keys = [
            "tenant".to_string(),
            "plan".to_string(),
            "region".to_string(),
        ];
        let id = pairs(&[("path", "/a"), ("plan", "gold"), ("tenant", "acme")]);
        assert_eq!(
            descriptor_of(Some(&keys), &id),
            pairs(&[("tenant", "acme"), ("plan", "gold")])
        );
        let id = pairs(&[("path", "/b")]);
        assert_eq!(descriptor_of(Some(&keys), &id), pairs(&[]));
    }
}

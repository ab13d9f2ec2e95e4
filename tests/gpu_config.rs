//! GPU device profiles and queue bounds from TOML, the device selection
//! variable, and the errors that name what is wrong.

#![cfg(feature = "config")]

use admission::gpu::GpuConfig;

const SAMPLE: &str = include_str!("../examples/gpu_devices.toml");

#[test]
fn the_selection_keeps_only_the_listed_ordinals() {
    for (selection, expected) in [
        (None, vec![0, 1]),
        (Some(""), vec![0, 1]),
        (Some("  "), vec![0, 1]),
        (Some("1"), vec![1]),
        (Some(" 1 , 0 "), vec![0, 1]),
    ] {
        let config = GpuConfig::from_toml(SAMPLE, selection).expect("valid selection");
        let ordinals: Vec<u32> = config.devices.ordinals().iter().map(|o| o.0).collect();
        assert_eq!(ordinals, expected, "selection {selection:?}");
    }
}

#[test]
fn a_selected_ordinal_without_a_profile_is_named() {
    let error = GpuConfig::from_toml(SAMPLE, Some("0,2")).expect_err("gpu2 has no profile");
    assert_eq!(error.field(), "ADMISSION_GPU_DEVICES");
    assert!(error.to_string().contains("gpu2"), "{error}");
}

#[test]
fn the_env_reader_uses_the_same_parser() {
    // The variable is not set by this test suite; unset means every device.
    if std::env::var_os("ADMISSION_GPU_DEVICES").is_none() {
        let config = GpuConfig::from_toml_and_env(SAMPLE).expect("valid");
        assert_eq!(config.devices.ordinals().len(), 2);
    }
}

fn with_profile(extra: &str) -> String {
    format!(
        "[admission.queue]\nmax_pending = 8\nmax_wait_ms = 1000\novertake_budget = 1\n\n\
         [[admission.device_profiles]]\nordinal = 0\n{extra}\n"
    )
}

#[test]
fn configuration_errors_name_the_field_or_table() {
    let cases: Vec<(String, &str)> = vec![
        ("not toml = = =".into(), "toml"),
        ("[server]\nport = 1".into(), "admission"),
        ("admission = 3".into(), "admission"),
        (
            "[[admission.device_profiles]]\nordinal = 0\nmanaged_capacity = 1\nmemory_ownership = \"exclusive\"".into(),
            "admission.queue",
        ),
        (
            "[admission.queue]\nmax_pending = 8\nmax_wait_ms = 1000\novertake_budget = 1".into(),
            "admission.device_profiles",
        ),
        (
            "[admission.queue]\nmax_pending = 8\nmax_wait_ms = 1000\novertake_budget = 1\nextra = 1\n"
                .into(),
            "admission.queue",
        ),
        (
            "[admission.queue]\nmax_pending = 0\nmax_wait_ms = 1000\novertake_budget = 1\n".into(),
            "max_pending",
        ),
        (
            "[admission.queue]\nmax_pending = 1\nmax_wait_ms = 0\novertake_budget = 1\n".into(),
            "max_wait",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nmemory_ownership = \"exclusive\"\ncolour = \"red\""),
            "admission.device_profiles",
        ),
        (
            with_profile("managed_capacity = -5\nmemory_ownership = \"exclusive\""),
            "admission.device_profiles",
        ),
        (
            with_profile("memory_ownership = \"exclusive\""),
            "managed_capacity",
        ),
        (
            with_profile("managed_capacity = \"80 parsecs\"\nmemory_ownership = \"exclusive\""),
            "managed_capacity",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nbackend_reserve = \"oops\"\nmemory_ownership = \"exclusive\""),
            "backend_reserve",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\ncache_cap = \"81GiB\"\nmemory_ownership = \"exclusive\""),
            "cache_cap",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nattempt_floor = \"96GiB\"\nmemory_ownership = \"exclusive\""),
            "attempt_floor",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nmax_active_attempts = 0\nmemory_ownership = \"exclusive\""),
            "max_active_attempts",
        ),
        (with_profile("managed_capacity = \"80GiB\""), "memory_ownership"),
        (
            with_profile("managed_capacity = \"80GiB\"\nmemory_ownership = \"borrowed\""),
            "memory_ownership",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nmemory_ownership = \"shared\""),
            "external_bytes",
        ),
        (
            with_profile("managed_capacity = \"80GiB\"\nmemory_ownership = \"exclusive\"\nexternal_bytes = 1"),
            "external_bytes",
        ),
        (
            with_profile(
                "managed_capacity = \"80GiB\"\nbackend_reserve = \"1GiB\"\nmemory_ownership = \"shared\"\nexternal_bytes = \"2GiB\"",
            ),
            "external_bytes",
        ),
        (
            with_profile(
                "managed_capacity = \"80GiB\"\nmemory_ownership = \"exclusive\"\n\n\
                 [[admission.device_profiles]]\nordinal = 0\nmanaged_capacity = \"80GiB\"\nmemory_ownership = \"exclusive\"",
            ),
            "device_profiles",
        ),
    ];
    for (toml, field) in cases {
        let error = GpuConfig::from_toml(&toml, None).expect_err(&toml);
        assert_eq!(error.field(), field, "{error}\n--- in ---\n{toml}");
    }
}

#[test]
fn an_unknown_key_error_names_the_key() {
    let toml =
        with_profile("managed_capacity = 1024\nmemory_ownership = \"exclusive\"\ncolour = 1");
    let error = GpuConfig::from_toml(&toml, None).expect_err("unknown key");
    assert!(error.to_string().contains("colour"), "{error}");
    assert!(error.to_string().contains("entry 0"), "{error}");
}

#[test]
fn an_unknown_key_under_admission_is_refused_naming_it() {
    // A misspelt table would otherwise be ignored and its settings lost.
    let toml = format!("{SAMPLE}\n[admission.queus]\nmax_pending = 1\n");
    let error = GpuConfig::from_toml(&toml, None).expect_err("unknown table");
    assert_eq!(error.field(), "admission", "{error}");
    assert!(error.to_string().contains("queus"), "{error}");
    let toml = SAMPLE.replace(
        "[admission.queue]",
        "[admission]\ncolour = 1\n\n[admission.queue]",
    );
    let error = GpuConfig::from_toml(&toml, None).expect_err("unknown key");
    assert!(error.to_string().contains("colour"), "{error}");
}

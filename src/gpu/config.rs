//! GPU device profiles and queue bounds read from TOML (feature `config`).
//!
//! The file declares one `[[admission.device_profiles]]` table per CUDA
//! ordinal, each with its memory ownership, and the three bounds of the one
//! queue in `[admission.queue]`:
//!
//! ```toml
//! [admission.queue]
//! max_pending = 64        # queued plus pending-preflight requests
//! max_wait_ms = 30000
//! overtake_budget = 4
//!
//! [[admission.device_profiles]]
//! ordinal = 0
//! managed_capacity = "80GiB"    # an integer (bytes) or a string with a unit
//! backend_reserve = "2GiB"
//! cache_cap = "16GiB"
//! max_active_attempts = 4
//! capabilities = ["hash_join", "sort"]
//! memory_ownership = "exclusive"  # or "shared", with external_bytes
//! ```
//!
//! Byte sizes are integers or strings: a whole number and an optional unit,
//! `B`, binary `KiB`/`MiB`/`GiB`/`TiB` or decimal `KB`/`MB`/`GB`/`TB`
//! (case-insensitive, whitespace allowed). Fractions are refused so that
//! every size is an exact integer.
//!
//! The environment variable `ADMISSION_GPU_DEVICES` (`"0,2"`) selects which
//! profiled ordinals the process uses; unset or empty selects all of them. A
//! selected ordinal without a profile is an error naming it.
//! [`GpuConfig::from_toml`] takes the selection as a parameter, so tests need
//! not touch the process environment; [`GpuConfig::from_toml_and_env`] reads
//! it. Every error is a [`ConfigError`] naming the field, table or variable
//! at fault; profiles are validated by the same builder as in code.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use super::backend::DeviceOrdinal;
use super::profile::{DeviceProfile, DeviceSet, MemoryOwnership, QueueBounds};
use super::proof::{Capability, CapabilitySet};
use crate::error::ConfigError;

/// The environment variable selecting device ordinals (`"0,2"`).
pub(crate) const DEVICES_ENV: &str = "ADMISSION_GPU_DEVICES";

/// The keys the `[admission]` table may hold.
const ADMISSION_KEYS: [&str; 2] = ["queue", "device_profiles"];

/// The GPU admission configuration: the selected devices and the queue
/// bounds, each validated by its own type, to hand to
/// [`QueryService::builder`](super::QueryService::builder).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct GpuConfig {
    /// The selected devices.
    pub devices: DeviceSet,
    /// The queue bounds.
    pub queue: QueueBounds,
}

impl GpuConfig {
    /// Parses `toml`, keeping the ordinals listed in `selection` (the value
    /// of `ADMISSION_GPU_DEVICES`); `None` or an empty string keeps every profile.
    ///
    /// # Errors
    ///
    /// [`ConfigError`] naming where the file is at fault: `toml` for text
    /// that is not TOML; `admission`, `admission.queue` or
    /// `admission.device_profiles` for a missing or malformed table or an
    /// unknown key; the field that a byte size, `memory_ownership`,
    /// [`QueueBounds::new`],
    /// [`DeviceProfileBuilder::build`](super::DeviceProfileBuilder::build) or
    /// [`DeviceSet::new`] refuses; and `ADMISSION_GPU_DEVICES` for a
    /// selection that is malformed (not comma-separated ordinals, or one
    /// repeated) or that names an ordinal without a profile.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::backend::DeviceOrdinal;
    /// use admission::gpu::GpuConfig;
    ///
    /// const TOML: &str = r#"
    /// [admission.queue]
    /// max_pending = 64
    /// max_wait_ms = 30000
    /// overtake_budget = 4
    ///
    /// [[admission.device_profiles]]
    /// ordinal = 0
    /// managed_capacity = "72GiB"
    /// backend_reserve = "4GiB"
    /// max_active_attempts = 4
    /// memory_ownership = "exclusive"
    ///
    /// [[admission.device_profiles]]
    /// ordinal = 1
    /// managed_capacity = "24GiB"
    /// memory_ownership = "exclusive"
    /// "#;
    ///
    /// let config = GpuConfig::from_toml(TOML, None).unwrap();
    /// assert_eq!(config.devices.ordinals().len(), 2);
    /// // A selection (the value of `ADMISSION_GPU_DEVICES`) narrows it.
    /// let only_1 = GpuConfig::from_toml(TOML, Some("1")).unwrap();
    /// assert_eq!(only_1.devices.ordinals(), vec![DeviceOrdinal(1)]);
    /// // A bad value names its field.
    /// let bad = TOML.replace("\"24GiB\"", "\"24 parsecs\"");
    /// assert_eq!(GpuConfig::from_toml(&bad, None).unwrap_err().field(), "managed_capacity");
    /// ```
    pub fn from_toml(toml: &str, selection: Option<&str>) -> Result<GpuConfig, ConfigError> {
        let root: toml::Table =
            toml::from_str(toml).map_err(|e| ConfigError::new("toml", e.to_string()))?;
        let admission = match root.get("admission") {
            Some(toml::Value::Table(table)) => table,
            Some(_) => return Err(ConfigError::new("admission", "must be a table")),
            None => {
                return Err(ConfigError::new(
                    "admission",
                    "the [admission] table is missing",
                ))
            }
        };

        // The inner tables deny unknown fields through serde; the
        // [admission] table is read by hand, so it checks its own keys: a
        // misspelt `[admission.queus]` must not be ignored with its settings.
        if let Some(unknown) = admission
            .keys()
            .find(|key| !ADMISSION_KEYS.contains(&key.as_str()))
        {
            return Err(ConfigError::new(
                "admission",
                format!(
                    "unknown key `{unknown}` (expected one of: {})",
                    ADMISSION_KEYS.join(", ")
                ),
            ));
        }

        let queue = match admission.get("queue") {
            Some(value) => {
                let raw: RawQueue = value
                    .clone()
                    .try_into()
                    .map_err(|e| ConfigError::new("admission.queue", e.to_string()))?;
                QueueBounds::new(
                    raw.max_pending,
                    Duration::from_millis(raw.max_wait_ms),
                    raw.overtake_budget,
                )?
            }
            None => {
                return Err(ConfigError::new(
                    "admission.queue",
                    "the [admission.queue] table is missing",
                ))
            }
        };

        let entries = match admission.get("device_profiles") {
            Some(toml::Value::Array(entries)) => entries,
            Some(_) => {
                return Err(ConfigError::new(
                    "admission.device_profiles",
                    "must be an array of tables ([[admission.device_profiles]])",
                ))
            }
            None => {
                return Err(ConfigError::new(
                    "admission.device_profiles",
                    "no [[admission.device_profiles]] table",
                ))
            }
        };
        let mut profiles = Vec::with_capacity(entries.len());
        let mut ownerships = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let raw: RawProfile = entry.clone().try_into().map_err(|e| {
                ConfigError::new("admission.device_profiles", format!("entry {i}: {e}"))
            })?;
            let (profile, ownership) = raw.build()?;
            profiles.push(profile);
            ownerships.push(ownership);
        }

        if let Some(selected) = parse_device_selection(selection.unwrap_or(""))? {
            if let Some(missing) = selected
                .iter()
                .find(|ordinal| !profiles.iter().any(|p| p.ordinal() == **ordinal))
            {
                return Err(ConfigError::new(
                    "ADMISSION_GPU_DEVICES",
                    format!("{missing} is selected but has no [[admission.device_profiles]] entry"),
                ));
            }
            profiles.retain(|p| selected.contains(&p.ordinal()));
            ownerships.retain(|o| selected.contains(&o.ordinal()));
        }
        let devices = DeviceSet::new(profiles, ownerships)?;
        Ok(GpuConfig { devices, queue })
    }

    /// [`from_toml`](Self::from_toml) with the selection read from
    /// `ADMISSION_GPU_DEVICES`.
    ///
    /// # Errors
    ///
    /// As [`from_toml`](Self::from_toml), and a [`ConfigError`] naming
    /// `ADMISSION_GPU_DEVICES` when the variable is not valid Unicode.
    ///
    /// # Examples
    ///
    /// ```
    /// use admission::gpu::GpuConfig;
    ///
    /// const TOML: &str = r#"
    /// [admission.queue]
    /// max_pending = 64
    /// max_wait_ms = 30000
    /// overtake_budget = 4
    ///
    /// [[admission.device_profiles]]
    /// ordinal = 0
    /// managed_capacity = "72GiB"
    /// backend_reserve = "4GiB"
    /// max_active_attempts = 4
    /// memory_ownership = "exclusive"
    ///
    /// [[admission.device_profiles]]
    /// ordinal = 1
    /// managed_capacity = "24GiB"
    /// memory_ownership = "exclusive"
    /// "#;
    ///
    /// // Every profiled device, unless ADMISSION_GPU_DEVICES selects some.
    /// let config = GpuConfig::from_toml_and_env(TOML).unwrap();
    /// assert_eq!(config.devices.ordinals().len(), 2);
    /// ```
    pub fn from_toml_and_env(toml: &str) -> Result<GpuConfig, ConfigError> {
        match std::env::var(DEVICES_ENV) {
            Ok(selection) => Self::from_toml(toml, Some(&selection)),
            Err(std::env::VarError::NotPresent) => Self::from_toml(toml, None),
            Err(std::env::VarError::NotUnicode(_)) => Err(ConfigError::new(
                "ADMISSION_GPU_DEVICES",
                "is not valid Unicode",
            )),
        }
    }
}

/// Parses a device selection (`"0,2"`): `None` for an empty (or blank)
/// selection, meaning every profiled device.
///
/// # Errors
///
/// [`ConfigError`] naming `ADMISSION_GPU_DEVICES` for a token that is not an
/// ordinal or an ordinal listed twice.
pub(crate) fn parse_device_selection(
    value: &str,
) -> Result<Option<Vec<DeviceOrdinal>>, ConfigError> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    let mut ordinals = Vec::new();
    for token in value.split(',') {
        let token = token.trim();
        let ordinal = token.parse::<u32>().map(DeviceOrdinal).map_err(|_| {
            ConfigError::new(
                "ADMISSION_GPU_DEVICES",
                format!("`{token}` is not a device ordinal (expected a list like \"0,2\")"),
            )
        })?;
        if ordinals.contains(&ordinal) {
            return Err(ConfigError::new(
                "ADMISSION_GPU_DEVICES",
                format!("{ordinal} is selected more than once"),
            ));
        }
        ordinals.push(ordinal);
    }
    Ok(Some(ordinals))
}

/// Parses a byte size string (`"80GiB"`, `"512 MiB"`, `"1000"`), naming
/// `field` in errors.
///
/// # Errors
///
/// [`ConfigError`] naming `field` when `text` has no leading digits, its unit
/// is not one of `B`, `KiB`, `MiB`, `GiB`, `TiB`, `KB`, `MB`, `GB`, `TB`
/// (case-insensitive), or the size does not fit in a `u64`.
pub(crate) fn parse_byte_size(field: &'static str, text: &str) -> Result<u64, ConfigError> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    if digits.is_empty() {
        return Err(ConfigError::new(
            field,
            format!(
                "`{text}` is not a byte size (expected a whole number and a unit, like \"80GiB\")"
            ),
        ));
    }
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(ConfigError::new(
                field,
                format!(
                "`{other}` in `{text}` is not a byte unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)"
            ),
            ))
        }
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| ConfigError::new(field, format!("`{text}` does not fit in 64 bits")))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    max_pending: usize,
    max_wait_ms: u64,
    overtake_budget: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    ordinal: u32,
    managed_capacity: Option<RawBytes>,
    backend_reserve: Option<RawBytes>,
    cache_cap: Option<RawBytes>,
    attempt_floor: Option<RawBytes>,
    max_active_attempts: Option<u32>,
    source_work_allowance: Option<u32>,
    streams_per_attempt: Option<u32>,
    workers_per_attempt: Option<u32>,
    lanes_per_attempt: Option<u32>,
    #[serde(default)]
    capabilities: Vec<String>,
    memory_ownership: Option<String>,
    external_bytes: Option<RawBytes>,
}

impl RawProfile {
    fn build(self) -> Result<(DeviceProfile, MemoryOwnership), ConfigError> {
        let ordinal = DeviceOrdinal(self.ordinal);
        let bytes =
            |field: &'static str, raw: Option<RawBytes>| -> Result<Option<u64>, ConfigError> {
                raw.map(|raw| raw.resolve(field)).transpose()
            };
        let mut builder = DeviceProfile::builder(ordinal);
        if let Some(v) = bytes("managed_capacity", self.managed_capacity)? {
            builder = builder.managed_capacity(v);
        }
        if let Some(v) = bytes("backend_reserve", self.backend_reserve)? {
            builder = builder.backend_reserve(v);
        }
        if let Some(v) = bytes("cache_cap", self.cache_cap)? {
            builder = builder.cache_cap(v);
        }
        if let Some(v) = bytes("attempt_floor", self.attempt_floor)? {
            builder = builder.attempt_floor(v);
        }
        if let Some(v) = self.max_active_attempts {
            builder = builder.max_active_attempts(v);
        }
        if let Some(v) = self.source_work_allowance {
            builder = builder.source_work_allowance(v);
        }
        if let Some(v) = self.streams_per_attempt {
            builder = builder.streams_per_attempt(v);
        }
        if let Some(v) = self.workers_per_attempt {
            builder = builder.workers_per_attempt(v);
        }
        if let Some(v) = self.lanes_per_attempt {
            builder = builder.lanes_per_attempt(v);
        }
        let capabilities: CapabilitySet =
            self.capabilities.into_iter().map(Capability::new).collect();
        let profile = builder.capabilities(capabilities).build()?;

        let external = bytes("external_bytes", self.external_bytes)?;
        let ownership = match (self.memory_ownership.as_deref(), external) {
            (Some("exclusive"), None) => MemoryOwnership::exclusive(ordinal),
            (Some("exclusive"), Some(_)) => {
                return Err(ConfigError::new(
                    "external_bytes",
                    format!("is set on {ordinal}, whose memory_ownership is \"exclusive\""),
                ))
            }
            (Some("shared"), Some(external)) => MemoryOwnership::shared(ordinal, external),
            (Some("shared"), None) => {
                return Err(ConfigError::new(
                    "external_bytes",
                    format!("is required on {ordinal}, whose memory_ownership is \"shared\""),
                ))
            }
            (Some(other), _) => {
                return Err(ConfigError::new(
                    "memory_ownership",
                    format!("`{other}` on {ordinal} is neither \"exclusive\" nor \"shared\""),
                ))
            }
            (None, _) => {
                return Err(ConfigError::new(
                    "memory_ownership",
                    format!("is required on {ordinal} (\"exclusive\" or \"shared\")"),
                ))
            }
        };
        Ok((profile, ownership))
    }
}

// A byte size as written: an integer, or a string parsed once its field is
// known (so that the error can name it).
enum RawBytes {
    Int(u64),
    Text(String),
}

impl RawBytes {
    fn resolve(self, field: &'static str) -> Result<u64, ConfigError> {
        match self {
            RawBytes::Int(n) => Ok(n),
            RawBytes::Text(text) => parse_byte_size(field, &text),
        }
    }
}

impl<'de> Deserialize<'de> for RawBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct BytesVisitor;

        impl Visitor<'_> for BytesVisitor {
            type Value = RawBytes;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte count (a non-negative integer, or a string like \"80GiB\")")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawBytes, E> {
                Ok(RawBytes::Int(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawBytes, E> {
                u64::try_from(v)
                    .map(RawBytes::Int)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawBytes, E> {
                Ok(RawBytes::Text(v.to_owned()))
            }
        }

        deserializer.deserialize_any(BytesVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::profile::OwnershipMode;

    const GIB: u64 = 1 << 30;
    const SAMPLE: &str = include_str!("../../examples/gpu_devices.toml");

    #[test]
    fn a_malformed_or_repeated_selection_is_refused() {
        for bad in ["0,x", "0,,1", "-1", "0,0"] {
            let error = parse_device_selection(bad).expect_err(bad);
            assert_eq!(error.field(), "ADMISSION_GPU_DEVICES", "{bad}");
        }
        assert_eq!(
            parse_device_selection("2,0"),
            Ok(Some(vec![DeviceOrdinal(2), DeviceOrdinal(0)]))
        );
    }

    #[test]
    fn byte_sizes_accept_integers_and_unit_strings() {
        for (text, bytes) in [
            ("512MiB", 512 << 20),
            ("80GiB", 80 * GIB),
            ("80 GiB", 80 * GIB),
            ("80gib", 80 * GIB),
            ("2TiB", 2 << 40),
            ("4KiB", 4096),
            ("80GB", 80_000_000_000),
            ("1MB", 1_000_000),
            ("3KB", 3_000),
            ("1TB", 1_000_000_000_000),
            ("1000", 1000),
            ("1000B", 1000),
        ] {
            assert_eq!(parse_byte_size("cache_cap", text), Ok(bytes), "{text}");
        }
        for bad in [
            "",
            "GiB",
            "1.5GiB",
            "80 XB",
            "-1GiB",
            "99999999999999999999",
            "17000000TiB",
        ] {
            let error = parse_byte_size("cache_cap", bad).expect_err(bad);
            assert_eq!(error.field(), "cache_cap", "{bad}");
        }
    }

    #[test]
    fn the_sample_file_declares_two_devices_and_the_queue_bounds() {
        let config = GpuConfig::from_toml(SAMPLE, None).expect("the sample is valid");
        let devices = &config.devices;
        assert_eq!(devices.ordinals(), vec![DeviceOrdinal(0), DeviceOrdinal(1)]);

        let gpu0 = devices.profile(DeviceOrdinal(0)).expect("profiled");
        assert_eq!(gpu0.managed_capacity(), 72 * GIB);
        assert_eq!(gpu0.backend_reserve(), 4 * GIB);
        assert_eq!(gpu0.cache_cap(), 16 * GIB);
        assert_eq!(gpu0.attempt_floor(), 9 * GIB, "derived: 72 GiB / 8");
        assert_eq!(gpu0.max_active_attempts(), 4);
        assert_eq!(gpu0.source_work_allowance(), 4);
        assert_eq!(gpu0.streams_per_attempt(), 4);
        assert_eq!(gpu0.capabilities().len(), 3);
        assert_eq!(
            devices.ownership(DeviceOrdinal(0)).map(|o| o.mode()),
            Some(OwnershipMode::Exclusive)
        );

        let gpu1 = devices.profile(DeviceOrdinal(1)).expect("profiled");
        assert_eq!(gpu1.managed_capacity(), 24 * GIB);
        assert_eq!(gpu1.attempt_floor(), 4 * GIB);
        assert_eq!(
            devices.ownership(DeviceOrdinal(1)).map(|o| o.mode()),
            Some(OwnershipMode::Shared {
                external_bytes: 2 * GIB
            })
        );

        let queue = config.queue;
        assert_eq!(queue.max_pending(), 64);
        assert_eq!(queue.max_wait(), Duration::from_secs(30));
        assert_eq!(queue.overtake_budget(), 4);
    }
}

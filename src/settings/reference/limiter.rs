//! The reference's variables for how decisions are made and reported:
//! `LIMIT_RESPONSE_HEADERS_ENABLED`, `SHADOW_MODE`, `QUOTA_MODE`,
//! `NEAR_LIMIT_RATIO`, `LOCAL_CACHE_SIZE_IN_BYTES`, `MERGE_DOMAIN_CONFIG`.

use super::{Vars, on_off};
use crate::settings::ServeArgs;

/// `--over-limit-cache on` when `LOCAL_CACHE_SIZE_IN_BYTES` is above 0.
pub(super) fn over_limit_cache(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(bytes) = vars.number::<u64>("LOCAL_CACHE_SIZE_IN_BYTES")? {
        let on = on_off(bytes > 0);
        vars.adopt(
            &mut args.over_limit_cache,
            on,
            "over_limit_cache",
            "LOCAL_CACHE_SIZE_IN_BYTES",
        )?;
    }
    Ok(())
}

/// `--near-limit-ratio` from `NEAR_LIMIT_RATIO`.
pub(super) fn near_limit_ratio(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(ratio) = vars.number::<f64>("NEAR_LIMIT_RATIO")? {
        vars.adopt(
            &mut args.near_limit_ratio,
            ratio,
            "near_limit_ratio",
            "NEAR_LIMIT_RATIO",
        )?;
    }
    Ok(())
}

/// `--response-headers` from `LIMIT_RESPONSE_HEADERS_ENABLED`.
pub(super) fn response_headers(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(on) = vars.boolean("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        let on = on_off(on);
        vars.adopt(
            &mut args.response_headers,
            on,
            "response_headers",
            "LIMIT_RESPONSE_HEADERS_ENABLED",
        )?;
    }
    Ok(())
}

/// `--shadow-mode` from `SHADOW_MODE`.
pub(super) fn shadow_mode(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(on) = vars.boolean("SHADOW_MODE")? {
        vars.adopt(&mut args.shadow_mode, on, "shadow_mode", "SHADOW_MODE")?;
    }
    Ok(())
}

/// `--quota-mode` from `QUOTA_MODE`.
pub(super) fn quota_mode(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    if let Some(on) = vars.boolean("QUOTA_MODE")? {
        vars.adopt(&mut args.quota_mode, on, "quota_mode", "QUOTA_MODE")?;
    }
    Ok(())
}

/// `MERGE_DOMAIN_CONFIG=true` turns `--merge-domains` on (it never
/// contradicts the flag: both only merge). `check` and `simulate` read it
/// too (`RuleLoadArgs::apply_reference_env`).
pub(super) fn merge_domains(args: &mut ServeArgs, vars: &Vars<'_>) -> Result<(), String> {
    args.rule_load.apply_reference_env(&|name| vars.set(name));
    Ok(())
}

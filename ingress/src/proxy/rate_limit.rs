//! The buckets behind `limit-rps`, `limit-rpm` and `limit-connections`: runtime state beside
//! the snapshot, per proxy instance (as ingress-nginx without its memcached option), keyed by the
//! route's typed [`RateLimit`] so an unchanged policy keeps its buckets across snapshot swaps.
//!
//! ```text
//!   RateLimiters ── RateLimit (zone = ns/name/uid + rates) ──> Zone
//!                                                              ├─ rps: GCRA per client address
//!                                                              ├─ rpm: GCRA per client address
//!                                                              └─ connections: in-flight count
//!                                                                 per client address (a guard
//!                                                                 held until the response ends)
//! ```
//!
//! nginx's `limit_req ... burst=B nodelay` serves B + 1 requests at once and then one per
//! 1/rate; a GCRA bucket (governor) of capacity B + 1 refilled at the rate is the same leaky
//! bucket. Memory stays bounded under a flood of distinct addresses: a bucket at rest is dropped
//! (`retain_recent`) when a zone reaches [`MAX_KEYS`] addresses (at most every
//! [`RETAIN_EVERY`]), and when it is still full, a request from a new address is refused as
//! nginx refuses one it cannot allocate a node for (503); a zone no route uses any more is
//! dropped once its buckets would have refilled.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use governor::clock::{Clock, MonotonicClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::snapshot::annotations::rate_limit::{Rate, RateLimit};

/// Client addresses one zone's bucket set holds at most (each about 50 bytes with the map's
/// overhead: a few MiB per zone, as nginx's 5 MiB zones hold tens of thousands).
pub const MAX_KEYS: usize = 65_536;
/// How often a full zone may drop its buckets at rest: the sweep is linear in its size.
pub const RETAIN_EVERY: Duration = Duration::from_millis(250);
/// How often zones no route uses are looked for.
const PRUNE_EVERY: Duration = Duration::from_secs(10);

/// Why a request was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limited {
    Rps,
    Rpm,
    Connections,
    /// The zone holds [`MAX_KEYS`] addresses whose buckets are not at rest.
    Overflow,
}

impl Limited {
    pub fn as_str(self) -> &'static str {
        match self {
            Limited::Rps => "rps",
            Limited::Rpm => "rpm",
            Limited::Connections => "connections",
            Limited::Overflow => "overflow",
        }
    }
}

type Keyed<C> =
    RateLimiter<IpAddr, HashMapStateStore<IpAddr>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// Every zone in use, by policy.
pub struct RateLimiters<C: Clock + Clone = MonotonicClock> {
    clock: C,
    zones: Mutex<Zones<C>>,
}

struct Zones<C: Clock + Clone> {
    by_policy: HashMap<RateLimit, Arc<Zone<C>>>,
    pruned: Instant,
}

/// One Ingress's buckets.
pub struct Zone<C: Clock + Clone = MonotonicClock> {
    rps: Option<Bucket<C>>,
    rpm: Option<Bucket<C>>,
    connections: Option<(u32, Mutex<HashMap<IpAddr, u32>>)>,
    /// How long after its last request every bucket of the zone is full again.
    refill: Duration,
    last_used: Mutex<Instant>,
}

struct Bucket<C: Clock + Clone> {
    limiter: Keyed<C>,
    limited: Limited,
    retained: Mutex<Instant>,
    full: AtomicBool,
}

/// A request counted toward `limit-connections` until this is dropped.
pub struct ConnectionGuard<C: Clock + Clone = MonotonicClock> {
    zone: Arc<Zone<C>>,
    client: IpAddr,
}

impl Default for RateLimiters<MonotonicClock> {
    fn default() -> Self {
        Self::with_clock(MonotonicClock)
    }
}

impl<C: Clock + Clone> RateLimiters<C> {
    pub fn with_clock(clock: C) -> Self {
        Self {
            clock,
            zones: Mutex::new(Zones {
                by_policy: HashMap::new(),
                pruned: Instant::now(),
            }),
        }
    }

    /// Counts one request from `client` against `limit`; `Err` when it must be refused. The
    /// guard, when the policy limits connections, must live until the response is sent.
    pub fn admit(
        &self,
        limit: &RateLimit,
        client: IpAddr,
    ) -> Result<Option<ConnectionGuard<C>>, Limited> {
        let client = client.to_canonical();
        if limit.exempts(client) {
            return Ok(None);
        }
        let zone = self.zone(limit);
        for bucket in [&zone.rps, &zone.rpm].into_iter().flatten() {
            bucket.check(client)?;
        }
        let Some((max, counts)) = &zone.connections else {
            return Ok(None);
        };
        let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
        let count = counts.entry(client).or_insert(0);
        if *count >= *max {
            return Err(Limited::Connections);
        }
        *count += 1;
        drop(counts);
        Ok(Some(ConnectionGuard {
            zone: zone.clone(),
            client,
        }))
    }

    /// How many zones are held.
    pub fn zones(&self) -> usize {
        self.lock().by_policy.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Zones<C>> {
        self.zones.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn zone(&self, limit: &RateLimit) -> Arc<Zone<C>> {
        let now = Instant::now();
        let mut zones = self.lock();
        if now.duration_since(zones.pruned) >= PRUNE_EVERY {
            zones.pruned = now;
            // A zone nobody holds a guard on, idle for as long as its buckets take to fill:
            // dropping it changes nothing a client could see.
            zones.by_policy.retain(|_, zone| {
                Arc::strong_count(zone) > 1 || now.duration_since(zone.last_used()) < zone.refill
            });
        }
        // A lookup first: the key is cloned only when a zone is made.
        let zone = match zones.by_policy.get(limit) {
            Some(zone) => zone.clone(),
            None => {
                let zone = Arc::new(Zone::new(limit, &self.clock));
                zones.by_policy.insert(limit.clone(), zone.clone());
                zone
            }
        };
        drop(zones);
        *zone
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = now;
        zone
    }
}

impl<C: Clock + Clone> Zone<C> {
    fn new(limit: &RateLimit, clock: &C) -> Self {
        let bucket = |rate: Option<Rate>, period: Duration, limited| {
            rate.and_then(|rate| Bucket::new(rate, period, limited, clock))
        };
        let refill = [
            (limit.rps, Duration::from_secs(1)),
            (limit.rpm, Duration::from_secs(60)),
        ]
        .into_iter()
        .filter_map(|(rate, period)| rate.map(|r| refill_time(r, period)))
        .max()
        .unwrap_or_default();
        Self {
            rps: bucket(limit.rps, Duration::from_secs(1), Limited::Rps),
            rpm: bucket(limit.rpm, Duration::from_secs(60), Limited::Rpm),
            connections: limit.connections.map(|n| (n, Mutex::new(HashMap::new()))),
            refill,
            last_used: Mutex::new(Instant::now()),
        }
    }

    fn last_used(&self) -> Instant {
        *self
            .last_used
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The quota nginx's `rate=<limit>r/<period> burst=<burst> nodelay` amounts to: one request
/// every period/limit, and burst + 1 at once.
pub fn quota(rate: Rate, period: Duration) -> Option<Quota> {
    let interval = period.checked_div(rate.limit)?;
    let capacity = NonZeroU32::new(rate.burst.saturating_add(1))?;
    Quota::with_period(interval).map(|q| q.allow_burst(capacity))
}

/// How long a bucket emptied by a burst takes to fill again.
fn refill_time(rate: Rate, period: Duration) -> Duration {
    period
        .checked_div(rate.limit)
        .unwrap_or_default()
        .saturating_mul(rate.burst.saturating_add(1))
}

impl<C: Clock + Clone> Bucket<C> {
    fn new(rate: Rate, period: Duration, limited: Limited, clock: &C) -> Option<Self> {
        Some(Self {
            limiter: RateLimiter::hashmap_with_clock(quota(rate, period)?, clock.clone()),
            limited,
            retained: Mutex::new(Instant::now()),
            full: AtomicBool::new(false),
        })
    }

    fn check(&self, client: IpAddr) -> Result<(), Limited> {
        if self.full.load(Ordering::Relaxed) || self.limiter.len() >= MAX_KEYS {
            self.make_room();
            if self.full.load(Ordering::Relaxed) {
                return Err(Limited::Overflow);
            }
        }
        self.limiter.check_key(&client).map_err(|_| self.limited)
    }

    /// Drops the buckets at rest, at most every [`RETAIN_EVERY`]; still full afterwards, new
    /// requests are refused until the next sweep makes room.
    fn make_room(&self) {
        let now = Instant::now();
        {
            let mut retained = self.retained.lock().unwrap_or_else(PoisonError::into_inner);
            if now.duration_since(*retained) < RETAIN_EVERY {
                return;
            }
            *retained = now;
        }
        self.limiter.retain_recent();
        self.limiter.shrink_to_fit();
        let full = self.limiter.len() >= MAX_KEYS;
        if full {
            tracing::warn!(
                addresses = self.limiter.len(),
                "a rate-limit zone is full of active clients; requests are refused (503) until some are at rest"
            );
        }
        self.full.store(full, Ordering::Relaxed);
    }
}

impl<C: Clock + Clone> Drop for ConnectionGuard<C> {
    fn drop(&mut self) {
        if let Some((_, counts)) = &self.zone.connections {
            let mut counts = counts.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(count) = counts.get_mut(&self.client) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    counts.remove(&self.client);
                }
            }
        }
    }
}

impl<C: Clock + Clone> std::fmt::Debug for ConnectionGuard<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionGuard")
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;

    use super::*;

    fn limit(rps: u32, rpm: u32, connections: u32, burst_multiplier: u32) -> RateLimit {
        let rate = |limit: u32| {
            (limit > 0).then(|| Rate {
                limit,
                burst: limit * burst_multiplier,
            })
        };
        RateLimit {
            zone: Arc::from("ns/ing/uid"),
            rps: rate(rps),
            rpm: rate(rpm),
            connections: (connections > 0).then_some(connections),
            allow: Arc::from(["10.0.0.0/8".parse::<ipnet::IpNet>().unwrap()]),
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// How many of `n` requests at once pass, then how many pass after `wait`.
    fn burst_then(
        limiters: &RateLimiters<FakeRelativeClock>,
        clock: &FakeRelativeClock,
        policy: &RateLimit,
        client: IpAddr,
        n: usize,
        wait: Duration,
    ) -> (usize, usize) {
        let first = (0..n)
            .filter(|_| limiters.admit(policy, client).is_ok())
            .count();
        clock.advance(wait);
        let second = (0..n)
            .filter(|_| limiters.admit(policy, client).is_ok())
            .count();
        (first, second)
    }

    #[test]
    fn nginx_leaky_bucket_arithmetic() {
        // (rps, rpm, multiplier, requests at once, wait, passed at once, passed after the wait)
        let cases = [
            // burst = 2 * 5 = 10: 11 at once (nginx: the first, then `burst` more), then 2/s.
            (2, 0, 5, 20, Duration::from_secs(1), 11, 2),
            (2, 0, 5, 20, Duration::from_millis(500), 11, 1),
            (2, 0, 5, 20, Duration::from_secs(10), 11, 11),
            // multiplier 1: rate + 1 at once.
            (10, 0, 1, 30, Duration::from_millis(100), 11, 1),
            // 60 per minute, burst 60: 61 at once, then one a second.
            (0, 60, 1, 100, Duration::from_secs(3), 61, 3),
            // Both: the tighter one decides.
            (100, 6, 1, 50, Duration::from_secs(10), 7, 1),
        ];
        for (rps, rpm, multiplier, n, wait, first, second) in cases {
            let clock = FakeRelativeClock::default();
            let limiters = RateLimiters::with_clock(clock.clone());
            let policy = limit(rps, rpm, 0, multiplier);
            let got = burst_then(&limiters, &clock, &policy, ip("192.0.2.1"), n, wait);
            assert_eq!(
                got,
                (first, second),
                "rps {rps} rpm {rpm} x{multiplier} {wait:?}"
            );
        }
    }

    #[test]
    fn clients_and_zones_are_separate_and_allowlisted_ones_free() {
        let clock = FakeRelativeClock::default();
        let limiters = RateLimiters::with_clock(clock.clone());
        let policy = limit(1, 0, 0, 1);
        let a = (0..5)
            .filter(|_| limiters.admit(&policy, ip("192.0.2.1")).is_ok())
            .count();
        let b = (0..5)
            .filter(|_| limiters.admit(&policy, ip("192.0.2.2")).is_ok())
            .count();
        let allowed = (0..5)
            .filter(|_| limiters.admit(&policy, ip("10.9.9.9")).is_ok())
            .count();
        assert_eq!((a, b, allowed), (2, 2, 5));
        assert_eq!(
            limiters.admit(&policy, ip("::ffff:192.0.2.1")).err(),
            Some(Limited::Rps),
            "an IPv4 client seen as IPv6 is the same client"
        );
        // Another Ingress (zone) has its own buckets; the same policy again shares them.
        let other = RateLimit {
            zone: Arc::from("ns/other/uid"),
            ..policy.clone()
        };
        assert!(limiters.admit(&other, ip("192.0.2.1")).is_ok());
        assert_eq!(
            limiters.admit(&policy.clone(), ip("192.0.2.1")).err(),
            Some(Limited::Rps)
        );
        assert_eq!(limiters.zones(), 2);
    }

    #[test]
    fn connections_are_counted_until_the_guard_drops() {
        let limiters = RateLimiters::with_clock(FakeRelativeClock::default());
        let policy = limit(0, 0, 2, 5);
        let client = ip("192.0.2.1");
        let first = limiters.admit(&policy, client).unwrap();
        let second = limiters.admit(&policy, client).unwrap();
        assert!(first.is_some() && second.is_some());
        assert_eq!(
            limiters.admit(&policy, client).err(),
            Some(Limited::Connections)
        );
        assert!(limiters.admit(&policy, ip("192.0.2.2")).is_ok());
        drop(first);
        let third = limiters.admit(&policy, client);
        assert!(matches!(third, Ok(Some(_))));
        drop(third);
        drop(second);
        let zone = limiters.zone(&policy);
        let (_, counts) = zone.connections.as_ref().unwrap();
        assert!(counts.lock().unwrap().is_empty(), "no entry left behind");
    }

    #[test]
    fn a_flood_of_addresses_stays_bounded() {
        let clock = FakeRelativeClock::default();
        let limiters = RateLimiters::with_clock(clock.clone());
        let policy = limit(1000, 0, 0, 1);
        let zone = limiters.zone(&policy);
        let bucket = zone.rps.as_ref().unwrap();
        for i in 0..(MAX_KEYS + 1000) {
            let client = IpAddr::from(std::net::Ipv6Addr::from(i as u128 + 1));
            let _ = limiters.admit(&policy, client);
            if i % 10_000 == 0 {
                // Time passes: earlier clients' buckets come to rest.
                clock.advance(Duration::from_secs(1));
                *bucket.retained.lock().unwrap() = Instant::now() - RETAIN_EVERY;
            }
        }
        assert!(bucket.limiter.len() <= MAX_KEYS, "{}", bucket.limiter.len());
    }

    #[test]
    fn quota_matches_nginx() {
        let q = quota(
            Rate {
                limit: 5,
                burst: 25,
            },
            Duration::from_secs(1),
        )
        .unwrap();
        assert_eq!(q.burst_size().get(), 26);
        assert_eq!(q.replenish_interval(), Duration::from_millis(200));
        let q = quota(
            Rate {
                limit: 30,
                burst: 30,
            },
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(q.replenish_interval(), Duration::from_secs(2));
        assert_eq!(
            refill_time(
                Rate {
                    limit: 30,
                    burst: 30
                },
                Duration::from_secs(60)
            ),
            Duration::from_secs(62)
        );
    }
}

//! The replicas of one upstream and what abserve has in flight on each: admission by sequence
//! slots and tokens (prompt + `max_tokens` of every running request), held back while a
//! replica's own saturation is above its threshold or its breaker is open, served in arrival
//! order.
//!
//! Invariants: on every replica, the reservations alive never exceed its sequence slots nor its
//! token capacity (a reservation is taken under the pool's lock, all of a group's on one replica
//! or none, and given back when dropped); a waiter is served before any later one of its
//! priority class and any of a less urgent class (one turn at a time: the head of the queue
//! holds the turn while it waits for room, and gives it up while a more urgent group waits — an
//! upstream's requests cannot be preempted, so a class only orders the queue); a cost larger than a
//! replica's capacity is refused by the caller before it waits (`Pool::fits`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use abserve_engine::Class;
use tokio::sync::Notify;

use super::breaker::Breaker;
use super::series::Series;

/// How much one replica holds, as it said (or as configured).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Requests it runs at once (its sequence slots).
    pub seqs: usize,
    /// Tokens of all of them together (its KV cache).
    pub tokens: usize,
    /// Tokens of one request (prompt + answer).
    pub context: usize,
}

/// One URL of an upstream.
pub struct Replica {
    pub url: String,
    pub limits: Limits,
    in_flight: Mutex<(usize, usize)>,
    /// The upstream's own saturation is at or above the threshold (scraped).
    pub saturated: AtomicBool,
    /// The last scraped saturation, in millionths (for `/metrics`).
    pub saturation_ppm: AtomicU64,
    pub breaker: Breaker,
}

impl Replica {
    pub fn new(url: String, limits: Limits, breaker: Breaker) -> Replica {
        Replica {
            url,
            limits,
            in_flight: Mutex::new((0, 0)),
            saturated: AtomicBool::new(false),
            saturation_ppm: AtomicU64::new(0),
            breaker,
        }
    }

    /// Shows this replica's breaker in `series` (0 closed, 1 open, 2 half-open).
    pub fn show_breaker(&self, series: &Series) {
        series
            .breaker
            .with_label_values(&[self.url.as_str()])
            .set(self.breaker.gauge() as i64);
    }

    /// (requests, tokens) abserve has in flight here.
    pub fn in_flight(&self) -> (usize, usize) {
        *self.in_flight.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Room taken on one replica for one request; given back when dropped.
pub struct Reservation {
    pool: Arc<Pool>,
    pub replica: usize,
    pub tokens: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let r = &self.pool.replicas[self.replica];
        {
            let mut f = r.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            f.0 -= 1;
            f.1 -= self.tokens;
            self.pool.show(r, *f);
        }
        self.pool.changed.notify_waiters();
    }
}

/// Why a group was not admitted.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every replica's breaker is open: nothing will take it soon.
    AllOpen,
}

pub struct Pool {
    pub replicas: Vec<Replica>,
    series: Option<Arc<Series>>,
    changed: Notify,
    turn: tokio::sync::Mutex<()>,
    /// Groups waiting for room, per priority class (in `Class::ALL` order).
    queued: [AtomicUsize; 3],
}

/// A group's place among the waiting of its class, for as long as it waits.
struct Queued<'a>(&'a Pool, Class);

impl<'a> Queued<'a> {
    fn new(pool: &'a Pool, class: Class) -> Self {
        pool.queued[class.index()].fetch_add(1, Ordering::SeqCst);
        // the head may be a less urgent group waiting for room: it gives the turn up now
        pool.changed.notify_waiters();
        Queued(pool, class)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued[self.1.index()].fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

impl Pool {
    pub fn new(replicas: Vec<Replica>, series: Option<Arc<Series>>) -> Arc<Pool> {
        Arc::new(Pool {
            replicas,
            series,
            changed: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
            queued: Default::default(),
        })
    }

    /// Shows a replica's requests and tokens in flight in its series.
    fn show(&self, r: &Replica, (seqs, tokens): (usize, usize)) {
        if let Some(s) = &self.series {
            s.in_flight
                .with_label_values(&[r.url.as_str()])
                .set(seqs as i64);
            s.tokens
                .with_label_values(&[r.url.as_str()])
                .set(tokens as i64);
        }
    }

    /// Whether a group of these costs could ever run at once on some replica.
    pub fn fits(&self, costs: &[usize]) -> bool {
        self.replicas.iter().any(|r| {
            costs.len() <= r.limits.seqs
                && costs.iter().all(|&c| c <= r.limits.context)
                && costs.iter().sum::<usize>() <= r.limits.tokens
        })
    }

    /// The smallest context of any replica (what a request must fit to run anywhere).
    pub fn context(&self) -> usize {
        self.replicas
            .iter()
            .map(|r| r.limits.context)
            .min()
            .unwrap_or(0)
    }

    /// Wakes waiters after something other than a release changed (saturation, a breaker).
    pub fn poke(&self) {
        self.changed.notify_waiters();
    }

    /// Whether a group of a more urgent class than `class` waits.
    fn more_urgent_waits(&self, class: Class) -> bool {
        Class::ALL
            .iter()
            .take_while(|&&c| c < class)
            .any(|c| self.queued[c.index()].load(Ordering::SeqCst) > 0)
    }

    /// Room for every cost of a group on one replica, waiting in class order and, within a
    /// class, in arrival order until there is; `affinity` (a hash of the variant's prompt
    /// prefix) prefers one replica (see `pick`). Cancelled by dropping the future.
    pub async fn take(
        self: &Arc<Self>,
        costs: &[usize],
        affinity: Option<u64>,
        class: Class,
    ) -> Result<Vec<Reservation>, Refusal> {
        let _queued = Queued::new(self, class);
        loop {
            let turn = self.turn.lock().await;
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if self.more_urgent_waits(class) {
                    break;
                }
                let now = Instant::now();
                if self.replicas.iter().all(|r| !r.breaker.admits(now)) {
                    return Err(Refusal::AllOpen);
                }
                if let Some(i) = self.pick(costs, affinity, now) {
                    return Ok(self.reserve(i, costs));
                }
                // saturation and breakers change without a release: look again now and then
                let _ = tokio::time::timeout(Duration::from_millis(250), changed).await;
            }
            // a more urgent group waits: it takes the turn, this one queues for it again
            drop(turn);
            let changed = self.changed.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
        }
    }

    /// The replica to run a group on now, if one has room: the preferred one (by affinity)
    /// while its tokens in flight exceed the least-loaded replica's by no more than the group's
    /// own cost, else the one with the fewest tokens in flight.
    fn pick(&self, costs: &[usize], affinity: Option<u64>, now: Instant) -> Option<usize> {
        let need: usize = costs.iter().sum();
        let room: Vec<Option<usize>> = self
            .replicas
            .iter()
            .map(|r| {
                let (seqs, tokens) = r.in_flight();
                let ok = r.breaker.admits(now)
                    && !r.saturated.load(Ordering::SeqCst)
                    && seqs + costs.len() <= r.limits.seqs
                    && tokens + need <= r.limits.tokens
                    && costs.iter().all(|&c| c <= r.limits.context);
                ok.then_some(tokens)
            })
            .collect();
        let least = room
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (t, i)))
            .min()
            .map(|(_, i)| i)?;
        if let Some(h) = affinity {
            let preferred = (h % self.replicas.len() as u64) as usize;
            if let (Some(t), Some(low)) = (room[preferred], room[least]) {
                if t <= low + need {
                    return Some(preferred);
                }
            }
        }
        Some(least)
    }

    /// Room for an admitted request on another replica than the one it holds, now, if one has
    /// it (the least loaded that admits and is not saturated): where a retry goes when its
    /// replica failed. Ahead of waiting groups, since this request was admitted already.
    pub fn elsewhere(self: &Arc<Self>, held: &Reservation) -> Option<Reservation> {
        let now = Instant::now();
        let i = (0..self.replicas.len())
            .filter(|&i| i != held.replica)
            .filter(|&i| {
                let r = &self.replicas[i];
                let (seqs, tokens) = r.in_flight();
                r.breaker.admits(now)
                    && !r.saturated.load(Ordering::SeqCst)
                    && seqs < r.limits.seqs
                    && tokens + held.tokens <= r.limits.tokens
                    && held.tokens <= r.limits.context
            })
            .min_by_key(|&i| self.replicas[i].in_flight().1)?;
        self.reserve(i, &[held.tokens]).pop()
    }

    fn reserve(self: &Arc<Self>, i: usize, costs: &[usize]) -> Vec<Reservation> {
        let r = &self.replicas[i];
        let mut f = r.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        f.0 += costs.len();
        f.1 += costs.iter().sum::<usize>();
        self.show(r, *f);
        r.breaker.started(Instant::now());
        costs
            .iter()
            .map(|&tokens| Reservation {
                pool: self.clone(),
                replica: i,
                tokens,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize, limits: Limits) -> Arc<Pool> {
        Pool::new(
            (0..n)
                .map(|i| {
                    Replica::new(
                        format!("http://r{i}"),
                        limits,
                        Breaker::new(3, Duration::from_secs(1)),
                    )
                })
                .collect(),
            None,
        )
    }

    const L: Limits = Limits {
        seqs: 4,
        tokens: 2048,
        context: 512,
    };

    #[tokio::test]
    async fn a_group_waits_for_room_and_takes_it_all_at_once() {
        let p = pool(1, L);
        assert!(p.fits(&[512, 512, 512, 512]));
        assert!(!p.fits(&[513]));
        assert!(!p.fits(&[100; 5]));
        let a = p
            .take(&[500, 500, 500], None, Class::Interactive)
            .await
            .unwrap();
        assert_eq!(p.replicas[0].in_flight(), (3, 1500));
        // two more do not fit next to three (4 slots): it waits until one ends
        let p2 = p.clone();
        let waiter = tokio::spawn(async move {
            p2.take(&[200, 200], None, Class::Interactive)
                .await
                .map(|r| r.len())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(a);
        assert_eq!(waiter.await.unwrap(), Ok(2));
        assert_eq!(p.replicas[0].in_flight(), (0, 0));
    }

    /// The order in which waiters of these classes, arriving 20 ms apart while the pool's one
    /// slot is taken, are served once it frees (by their position in `classes`).
    async fn served_order(classes: &[Class]) -> Vec<usize> {
        let p = pool(1, Limits { seqs: 1, ..L });
        let first = p.take(&[10], None, Class::Interactive).await.unwrap();
        let order = Arc::new(Mutex::new(vec![]));
        let mut tasks = vec![];
        for (i, &class) in classes.iter().enumerate() {
            let (p, order) = (p.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let r = p.take(&[10], None, class).await.unwrap();
                order.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(5)).await;
                drop(r);
            }));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap().clone();
        order
    }

    #[tokio::test]
    async fn waiters_are_served_in_arrival_order() {
        assert_eq!(served_order(&[Class::Interactive; 3]).await, [0, 1, 2]);
    }

    #[tokio::test]
    async fn a_more_urgent_class_is_served_before_earlier_waiters_of_less_urgent_ones() {
        let classes = [
            Class::Batch,
            Class::Batch,
            Class::Fanout,
            Class::Interactive,
        ];
        assert_eq!(served_order(&classes).await, [3, 2, 0, 1]);
    }

    #[tokio::test]
    async fn replicas_take_the_least_loaded_and_affinity_within_its_share() {
        let p = pool(2, L);
        let a = p.take(&[300], Some(0), Class::Interactive).await.unwrap();
        assert_eq!(a[0].replica, 0);
        // affinity to replica 0 holds while it is not fuller than its share
        let b = p.take(&[300], Some(0), Class::Interactive).await.unwrap();
        assert_eq!(b[0].replica, 0);
        // now replica 0 holds 600 of 600: a third goes to the emptier one
        let c = p.take(&[300], Some(0), Class::Interactive).await.unwrap();
        assert_eq!(c[0].replica, 1);
        // without affinity: the least loaded
        let d = p.take(&[10], None, Class::Interactive).await.unwrap();
        assert_eq!(d[0].replica, 1);
    }

    #[tokio::test]
    async fn a_retry_moves_to_another_replica_with_room_and_gives_the_first_back() {
        let p = pool(
            3,
            Limits {
                seqs: 1,
                tokens: 100,
                context: 100,
            },
        );
        let a = p
            .take(&[40], Some(0), Class::Interactive)
            .await
            .unwrap()
            .pop()
            .unwrap();
        let _busy = p.take(&[10], None, Class::Interactive).await.unwrap();
        let b = p.elsewhere(&a).expect("the third replica is free");
        assert!(b.replica != a.replica && p.replicas[b.replica].in_flight() == (1, 40));
        // every other replica full: nowhere to go
        assert!(p.elsewhere(&b).is_none());
        let first = a.replica;
        drop(a);
        assert_eq!(p.replicas[first].in_flight(), (0, 0));
    }

    #[tokio::test]
    async fn saturation_and_open_breakers_hold_work_back() {
        let p = pool(1, L);
        p.replicas[0].saturated.store(true, Ordering::SeqCst);
        let p2 = p.clone();
        let waiter = tokio::spawn(async move {
            p2.take(&[10], None, Class::Interactive)
                .await
                .map(|r| r.len())
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        p.replicas[0].saturated.store(false, Ordering::SeqCst);
        p.poke();
        assert_eq!(waiter.await.unwrap(), Ok(1));
        for _ in 0..3 {
            p.replicas[0].breaker.failed(Instant::now());
        }
        assert_eq!(
            p.take(&[10], None, Class::Interactive).await.err(),
            Some(Refusal::AllOpen)
        );
    }
}

//! Call and driver slots shared fairly between tenants. Each kind is a global count and a
//! cap per tenant, a share of it (`EngineConfig::tenant_share_percent`): a slot needs a
//! permit of both. A tenant whose participants hang holds its calls and its drivers until
//! they time out, and without a cap of its own it would hold every slot for that long;
//! with one, it holds its share at most and every other tenant finds the rest free. The
//! cap is a reservation, not a scheduler: a slot in use cannot be taken back, so only a
//! bound on what one tenant may hold keeps room for the others at all times.
//!
//! A tenant's permit is taken first, the global one second: a tenant that waits for its
//! own cap waits without holding anything the others need, and at most its share of the
//! global queue is ever one tenant's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One kind of slot (calls, or transactions driven).
pub(super) struct Slots {
    global: Arc<Semaphore>,
    /// How many one tenant may hold.
    per_tenant: usize,
    /// Created on a tenant's first use and kept: tenants are the operator's (each has
    /// tokens), so there are few, and a semaphore is a few words.
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// Slots held by one tenant: handed back when dropped.
#[derive(Debug)]
pub struct Slot {
    global: OwnedSemaphorePermit,
    _tenant: OwnedSemaphorePermit,
}

impl Slot {
    /// How many slots this is.
    pub fn count(&self) -> usize {
        self.global.num_permits()
    }
}

/// Permits of the global count taken ahead of knowing whose they are (a claim of due
/// rows), each turned into a [`Slot`] of its row's tenant or given back.
pub(super) struct Reserved(OwnedSemaphorePermit);

impl Slots {
    /// `total` slots, of which one tenant may hold `share_percent` per cent (at least
    /// one).
    pub(super) fn new(total: usize, share_percent: u8) -> Slots {
        let total = total.max(1);
        Slots {
            global: Arc::new(Semaphore::new(total)),
            per_tenant: tenant_cap(total, share_percent),
            tenants: Mutex::new(HashMap::new()),
        }
    }

    /// How many slots one tenant may hold.
    pub(super) fn per_tenant(&self) -> usize {
        self.per_tenant
    }

    /// Slots free over all tenants.
    pub(super) fn available(&self) -> usize {
        self.global.available_permits()
    }

    fn tenant(&self, tenant: &str) -> Arc<Semaphore> {
        let mut tenants = self.tenants.lock().expect("poisoned");
        Arc::clone(
            tenants
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant))),
        )
    }

    /// `n` slots for `tenant` (at most its cap), waiting for them.
    pub(super) async fn acquire(&self, tenant: &str, n: usize) -> Slot {
        let n = n.clamp(1, self.per_tenant) as u32;
        let own = self.tenant(tenant);
        let _tenant = own
            .acquire_many_owned(n)
            .await
            .expect("slot semaphores are never closed");
        let global = Arc::clone(&self.global)
            .acquire_many_owned(n)
            .await
            .expect("slot semaphores are never closed");
        Slot { global, _tenant }
    }

    /// One slot for `tenant` now, if both it and the whole have one free.
    pub(super) fn try_acquire(&self, tenant: &str) -> Option<Slot> {
        let _tenant = self.tenant(tenant).try_acquire_owned().ok()?;
        let global = Arc::clone(&self.global).try_acquire_owned().ok()?;
        Some(Slot { global, _tenant })
    }

    /// Up to `n` slots of the whole, whoever's they turn out to be.
    pub(super) fn reserve(&self, n: usize) -> Option<Reserved> {
        let n = n.min(self.global.available_permits());
        (n > 0)
            .then(|| {
                Arc::clone(&self.global)
                    .try_acquire_many_owned(n as u32)
                    .ok()
            })
            .flatten()
            .map(Reserved)
    }

    /// One of `reserved` as `tenant`'s slot, if the tenant has room; `None` leaves it
    /// reserved.
    pub(super) fn assign(&self, reserved: &mut Reserved, tenant: &str) -> Option<Slot> {
        let _tenant = self.tenant(tenant).try_acquire_owned().ok()?;
        let global = reserved.0.split(1)?;
        Some(Slot { global, _tenant })
    }

    /// The tenants that have no slot free, and those with fewer free than `limit`, with
    /// how many: what a claim of `limit` due rows must leave out, or take only so many of.
    /// A tenant not listed has at least `limit` free (or has never held one: its cap).
    pub(super) fn short_of(&self, limit: usize) -> (Vec<String>, Vec<(String, usize)>) {
        let tenants = self.tenants.lock().expect("poisoned");
        let mut full = Vec::new();
        let mut partial = Vec::new();
        for (name, semaphore) in tenants.iter() {
            match semaphore.available_permits() {
                0 => full.push(name.clone()),
                free if free < limit => partial.push((name.clone(), free)),
                _ => {}
            }
        }
        (full, partial)
    }
}

impl Reserved {
    /// How many are left unassigned.
    pub(super) fn left(&self) -> usize {
        self.0.num_permits()
    }
}

/// A tenant's cap: `share_percent` of `total`, rounded up, at least one.
fn tenant_cap(total: usize, share_percent: u8) -> usize {
    let share = usize::from(share_percent.clamp(1, 100));
    (total * share).div_ceil(100).clamp(1, total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_gets_its_share_and_the_others_the_rest() {
        let slots = Slots::new(8, 50);
        assert_eq!(slots.per_tenant(), 4);
        let a: Vec<Slot> = (0..4).map(|_| slots.try_acquire("a").unwrap()).collect();
        // Its share is used up while half the slots are free.
        assert!(slots.try_acquire("a").is_none());
        assert_eq!(slots.available(), 4);
        let b: Vec<Slot> = (0..4).map(|_| slots.try_acquire("b").unwrap()).collect();
        assert!(slots.try_acquire("c").is_none(), "the whole is used up");
        drop(a);
        assert!(slots.try_acquire("c").is_some());
        drop(b);
        assert_eq!(slots.available(), 8);
    }

    #[test]
    fn the_cap_is_a_share_rounded_up_and_never_zero() {
        assert_eq!(tenant_cap(1_024, 50), 512);
        assert_eq!(tenant_cap(5, 50), 3);
        assert_eq!(tenant_cap(1, 10), 1);
        assert_eq!(tenant_cap(10, 100), 10);
        assert_eq!(tenant_cap(10, 0), 1);
    }

    #[tokio::test]
    async fn a_round_waits_for_its_tenants_own_room_without_holding_the_whole() {
        let slots = Arc::new(Slots::new(4, 50));
        let held = slots.acquire("a", 2).await;
        assert_eq!(held.count(), 2);
        // A wider round than the cap is cut to it.
        let waiting = {
            let slots = Arc::clone(&slots);
            tokio::spawn(async move { slots.acquire("a", 10).await.count() })
        };
        tokio::task::yield_now().await;
        // Tenant a waits for its own cap, holding none of the whole: b gets the rest.
        let b = slots.acquire("b", 2).await;
        assert_eq!(slots.available(), 0);
        drop(b);
        drop(held);
        assert_eq!(waiting.await.unwrap(), 2);
    }

    #[test]
    fn reserved_slots_are_assigned_to_tenants_with_room_only() {
        let slots = Slots::new(4, 50);
        let _a = slots.try_acquire("a").unwrap();
        let mut reserved = slots.reserve(10).unwrap();
        assert_eq!(reserved.left(), 3);
        assert_eq!(slots.short_of(3), (vec![], vec![("a".to_owned(), 1)]));
        let second = slots.assign(&mut reserved, "a").unwrap();
        assert!(
            slots.assign(&mut reserved, "a").is_none(),
            "a is at its cap"
        );
        assert_eq!(slots.short_of(3).0, vec!["a".to_owned()]);
        assert_eq!(reserved.left(), 2);
        let _b = slots.assign(&mut reserved, "b").unwrap();
        drop(reserved);
        drop(second);
        assert_eq!(slots.available(), 2);
    }
}

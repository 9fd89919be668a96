//! What a [`MasterSet`](crate::MasterSet) says when it could not take a lock: each master's answer.

use std::fmt;

use super::LockError;

/// What one master answered to an acquisition on a [`MasterSet`](crate::MasterSet).
#[derive(Debug)]
#[non_exhaustive]
pub enum MasterOutcome {
    /// Granted (and given back, as the set did not get enough grants).
    Granted,
    /// Granted, but the grant's validity ran out before enough masters answered.
    Expired,
    /// Held by someone else.
    Busy,
    /// Unreachable or failing, or too slow for its budget; the error says why.
    Failed(LockError),
}

/// A lock a [`MasterSet`](crate::MasterSet) could not take before its wait ran out: what each master answered to
/// the last attempt. Nothing granted is left behind: every grant was given back (a master that
/// stopped answering after it granted gets its release when it answers again, or its lease
/// runs out).
#[derive(Debug)]
pub struct MastersError {
    name: String,
    need: usize,
    outcomes: Vec<MasterOutcome>,
}

impl MastersError {
    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many masters had to grant.
    pub fn needed(&self) -> usize {
        self.need
    }

    /// Each master's answer to the last attempt, by index in the set.
    pub fn outcomes(&self) -> &[MasterOutcome] {
        &self.outcomes
    }

    fn indices(&self, pick: impl Fn(&MasterOutcome) -> bool) -> Vec<usize> {
        (self.outcomes.iter().enumerate())
            .filter(|(_, o)| pick(o))
            .map(|(i, _)| i)
            .collect()
    }

    /// The masters that granted the lock (and were given it back).
    pub fn granted(&self) -> Vec<usize> {
        self.indices(|o| matches!(o, MasterOutcome::Granted | MasterOutcome::Expired))
    }

    /// The masters where someone else held it.
    pub fn busy(&self) -> Vec<usize> {
        self.indices(|o| matches!(o, MasterOutcome::Busy))
    }

    /// The masters that could not be reached or failed.
    pub fn failed(&self) -> Vec<usize> {
        self.indices(|o| matches!(o, MasterOutcome::Failed(_)))
    }

    /// Whether enough masters answered that only a rival's hold stood in the way (no master
    /// failure decided it): the lock is busy, worth retrying later.
    pub fn is_busy(&self) -> bool {
        self.outcomes.len() - self.failed().len() >= self.need
    }
}

impl fmt::Display for MastersError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lock `{}` needs {} of {} masters: granted by {:?}, busy on {:?}, failed on {:?}",
            self.name,
            self.need,
            self.outcomes.len(),
            self.granted(),
            self.busy(),
            self.failed()
        )?;
        for (i, outcome) in self.outcomes.iter().enumerate() {
            if let MasterOutcome::Failed(err) = outcome {
                write!(f, "; master {i}: {err}")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for MastersError {}

impl MastersError {
    /// The error for `name`, which needed `need` grants, with each master's answer.
    pub(crate) fn new(name: String, need: usize, outcomes: Vec<MasterOutcome>) -> Self {
        Self {
            name,
            need,
            outcomes,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::BackendError;

    fn unreachable() -> MasterOutcome {
        MasterOutcome::Failed(LockError::Backend(BackendError::timeout(
            Duration::from_millis(5),
        )))
    }

    #[test]
    fn busy_means_enough_masters_answered() {
        use MasterOutcome::{Busy, Granted};
        let busy = MastersError::new("a".to_owned(), 2, vec![Granted, Busy, unreachable()]);
        assert!(busy.is_busy());
        assert!(LockError::Masters(Box::new(busy)).is_busy());
        let down = MastersError::new(
            "a".to_owned(),
            2,
            vec![Granted, unreachable(), unreachable()],
        );
        assert!(!down.is_busy());
        assert_eq!(down.granted(), vec![0]);
        assert_eq!(down.failed(), vec![1, 2]);
        assert_eq!(
            down.to_string(),
            "lock `a` needs 2 of 3 masters: granted by [0], busy on [], failed on [1, 2]; \
             master 1: lock backend unavailable: no answer from the backend within 5ms; \
             master 2: lock backend unavailable: no answer from the backend within 5ms"
        );
        let err = LockError::Masters(Box::new(down));
        assert!(err.is_backend() && !err.is_busy());
    }
}

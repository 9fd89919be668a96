//! Semaphores and read-write locks on a real Redis Cluster (three masters, three replicas):
//! their keys share the name's slot, their scripts run on its master, and their waiters are
//! woken through sharded pub/sub.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use dlock_core::Locker;
use dlock_tests::{RedisCluster, unique_name};
use tokio::task::block_in_place;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_read_write_locks_work_on_a_cluster() {
    let cluster = block_in_place(RedisCluster::start);
    let build = || Locker::builder().cluster(cluster.seed_urls()).build();
    let (a, b) = (
        build().await.expect("locker"),
        build().await.expect("locker"),
    );

    // A semaphore of 2 under 3 tasks from two lockers: never more than 2 in, and a waiter is
    // let in by a release (woken, well before any lease would end).
    let name = unique_name("cluster-sem");
    let (now, most) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let semaphore = if i % 2 == 0 { &a } else { &b }.semaphore(name.as_str(), 2);
        let (now, most) = (now.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            let permit = (semaphore.acquire().wait(Duration::from_secs(10)))
                .await
                .expect("permit");
            most.fetch_max(now.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(20)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            assert!(permit.release().await.is_released());
        }));
    }
    let started = Instant::now();
    for task in tasks {
        task.await.expect("task");
    }
    assert_eq!(most.load(Ordering::SeqCst), 2);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let status = a
        .semaphore(name.as_str(), 2)
        .status()
        .await
        .expect("status");
    assert_eq!(status.held, 0);

    // A read-write lock: two readers together, a writer waits for both and keeps a third
    // reader out, then gets in when they leave.
    let name = unique_name("cluster-rw");
    let (ra, rb) = (
        a.read_write_lock(name.as_str()),
        b.read_write_lock(name.as_str()),
    );
    let first = ra.read().await.expect("read");
    let second = rb.read().await.expect("read beside it");
    let writer = tokio::spawn({
        let rb = rb.clone();
        async move { rb.write().wait(Duration::from_secs(10)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        ra.read().try_lock().await.expect("try").is_none(),
        "a writer waits"
    );
    assert!(first.release().await.is_released());
    assert!(second.release().await.is_released());
    let write = writer
        .await
        .expect("task")
        .expect("the writer is woken and gets in");
    assert!(
        ra.read().try_lock().await.expect("try").is_none(),
        "the writer holds it"
    );
    assert!(write.release().await.is_released());
    let read = ra
        .read()
        .try_lock()
        .await
        .expect("try")
        .expect("free again");
    assert!(read.release().await.is_released());
}

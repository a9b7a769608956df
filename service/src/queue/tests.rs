//! The queue against its state machine: any sequence of moves leaves every
//! job where `JobState::after` says, illegal moves change nothing, and output
//! is accepted only while a job runs.

use proptest::prelude::*;

use super::job::{ALL_TRANSITIONS, DEFAULT_MAX_TOKENS};
use super::*;

fn queue() -> (tempfile::TempDir, Queue) {
    let dir = tempfile::tempdir().unwrap();
    let q = Queue::open(&dir.path().join("queue.sqlite")).unwrap();
    q.add_model(&ModelEntry {
        name: "m".into(),
        kind: ModelKind::Local {
            path: "/models/m".into(),
        },
        created_ms: 0,
    })
    .unwrap();
    (dir, q)
}

fn new_job(title: &str, priority: i64) -> NewJob {
    NewJob {
        prompt_ids: None,
        title: title.into(),
        model: "m".into(),
        request: Request {
            input: Input::Prompt("hello".into()),
            attachments: String::new(),
            settings: Settings::default(),
            chat_args: Default::default(),
            rendered_at: None,
            tools: Vec::new(),
            forced_call: None,
            tool_format: None,
        },
        priority,
        origin: "test".into(),
    }
}

fn apply(q: &Queue, id: i64, t: Transition) -> Result<(), QueueError> {
    match t {
        Transition::Start => q.start(id),
        Transition::Finish => q.finish(id, &Output::default(), "eos", &JobStats::default()),
        Transition::Fail => q.fail(id, "boom", &JobStats::default()),
        Transition::Cancel => q.cancel(id).map(|_| ()),
        Transition::Pause => q.pause(id, PauseCause::User, "asked").map(|_| ()),
        Transition::Resume => q.resume(id),
        Transition::Interrupt => q.recover(None).map(|_| ()),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn the_queue_follows_its_state_machine(
        ops in proptest::collection::vec((0usize..3, 0usize..ALL_TRANSITIONS.len(), any::<bool>()), 1..40),
    ) {
        let (_dir, q) = queue();
        let ids: Vec<i64> = (0..3).map(|i| q.submit(&new_job(&format!("j{i}"), 0)).unwrap().id).collect();
        let mut model = [JobState::Queued; 3];
        let mut tokens = [0usize; 3];
        for (j, t, write) in ops {
            let t = ALL_TRANSITIONS[t];
            let result = apply(&q, ids[j], t);
            if t == Transition::Interrupt {
                // Recovery moves every running job.
                for s in model.iter_mut().filter(|s| **s == JobState::Running) {
                    *s = JobState::Interrupted;
                }
                prop_assert!(result.is_ok());
            } else {
                match model[j].after(t) {
                    Some(next) => { prop_assert!(result.is_ok(), "{:?} --{:?}: {:?}", model[j], t, result); model[j] = next; }
                    None => prop_assert!(matches!(result, Err(QueueError::Illegal { .. })), "{:?} --{:?} allowed", model[j], t),
                }
            }
            if write {
                let committed = q.commit(ids[j], &Output::text(&[7, 8], 2, "ab"));
                prop_assert_eq!(committed.is_ok(), model[j] == JobState::Running);
                if committed.is_ok() { tokens[j] += 2; }
            }
            for (k, &id) in ids.iter().enumerate() {
                let v = q.job(id).unwrap();
                prop_assert_eq!(v.state, model[k]);
                prop_assert_eq!(v.tokens, tokens[k]);
                prop_assert_eq!(v.output.unwrap().len(), tokens[k]);
            }
        }
        prop_assert_eq!(q.integrity_check().unwrap(), "ok");
    }
}

#[test]
fn interrupted_jobs_run_first_then_priority_then_order() {
    let (_dir, q) = queue();
    let a = q.submit(&new_job("a", 0)).unwrap().id;
    let b = q.submit(&new_job("b", 5)).unwrap().id;
    let c = q.submit(&new_job("c", 0)).unwrap().id;
    assert_eq!(q.next_runnable().unwrap().unwrap().id, b, "higher priority");
    q.start(c).unwrap();
    q.commit(c, &Output::text(&[1, 2, 3], 3, "xyz")).unwrap();
    assert_eq!(q.recover(None).unwrap(), vec![c]);
    let next = q.next_runnable().unwrap().unwrap();
    assert_eq!(next.id, c, "an interrupted job goes first");
    assert_eq!(next.committed_tokens, vec![1, 2, 3]);
    assert_eq!(next.committed_text, "xyz");
    assert!(next.resumed);
    assert_eq!(q.job(a).unwrap().queue_position, Some(3));
    assert!(q.job(c).unwrap().log.contains("interrupted"));
}

#[test]
fn reordering_moves_a_job_within_its_priority() {
    let (_dir, q) = queue();
    let ids: Vec<i64> = (0..4)
        .map(|i| q.submit(&new_job(&format!("{i}"), 0)).unwrap().id)
        .collect();
    q.reorder(ids[3], 0).unwrap();
    q.reorder(ids[0], 2).unwrap();
    let order: Vec<i64> = {
        let mut waiting: Vec<JobView> = q
            .list()
            .unwrap()
            .into_iter()
            .filter(|v| v.queue_position.is_some())
            .collect();
        waiting.sort_by_key(|v| v.queue_position);
        waiting.iter().map(|v| v.id).collect()
    };
    assert_eq!(order, vec![ids[3], ids[1], ids[0], ids[2]]);
    q.start(ids[1]).unwrap();
    assert!(matches!(
        q.reorder(ids[1], 0),
        Err(QueueError::Illegal { .. })
    ));
}

#[test]
fn bad_submissions_are_refused_with_a_reason() {
    let (_dir, q) = queue();
    let mut job = new_job("t", 0);
    job.model = "nope".into();
    assert!(matches!(q.submit(&job), Err(QueueError::NoSuchModel(_))));
    let err = q.submit(&new_job("  ", 0)).unwrap_err().to_string();
    assert!(err.contains("title"), "{err}");
    assert!(matches!(q.job(999), Err(QueueError::NoSuchJob(999))));
    assert_eq!(Settings::default().max_tokens, DEFAULT_MAX_TOKENS);
}

#[test]
fn models_register_once_and_hide_their_keys() {
    let (_dir, q) = queue();
    let remote = ModelEntry {
        name: "far".into(),
        kind: ModelKind::Remote {
            url: "http://127.0.0.1:9/".into(),
            api_key: Some("secret".into()),
            remote_model: "m".into(),
        },
        created_ms: 0,
    };
    q.add_model(&remote).unwrap();
    assert!(q.add_model(&remote).is_err(), "names are unique");
    let stored = q.model("far").unwrap();
    assert!(
        matches!(&stored.kind, ModelKind::Remote { url, api_key: Some(k), .. } if url == "http://127.0.0.1:9" && k == "secret")
    );
    let json = serde_json::to_string(&stored).unwrap();
    assert!(!json.contains("secret"), "{json}");
    let bad = ModelEntry {
        name: "x".into(),
        kind: ModelKind::Remote {
            url: "ftp://x".into(),
            api_key: None,
            remote_model: "m".into(),
        },
        created_ms: 0,
    };
    assert!(
        q.add_model(&bad)
            .unwrap_err()
            .to_string()
            .contains("http://")
    );
    q.remove_model("far").unwrap();
    assert!(matches!(
        q.remove_model("far"),
        Err(QueueError::NoSuchModel(_))
    ));
}

#[test]
fn a_job_that_crashes_the_service_three_times_in_a_row_fails() {
    use crate::runner::crash::Crash;
    let (_dir, q) = queue();
    let a = q.submit(&new_job("a", 0)).unwrap().id;
    let b = q.submit(&new_job("b", 0)).unwrap().id;
    let crash = Crash {
        jobs: vec![a],
        signal: "abort (SIGABRT)".into(),
    };
    // Crash, crash, then a kill (no record): the row starts again.
    for record in [Some(&crash), Some(&crash), None, Some(&crash), Some(&crash)] {
        q.start(a).unwrap();
        assert_eq!(q.recover(record).unwrap(), vec![a]);
        assert_eq!(q.job(a).unwrap().state, JobState::Interrupted);
    }
    q.start(a).unwrap();
    assert_eq!(q.recover(Some(&crash)).unwrap(), Vec::<i64>::new());
    let failed = q.job(a).unwrap();
    assert_eq!(failed.state, JobState::Failed);
    let error = failed.error.unwrap();
    assert!(
        error.contains("crashed (abort (SIGABRT))") && error.contains("3 times"),
        "{error}"
    );
    assert_eq!(
        q.next_runnable().unwrap().unwrap().id,
        b,
        "the queue goes on"
    );
}

#[test]
fn resumes_and_wall_time_survive_a_crash() {
    let (_dir, q) = queue();
    let a = q.submit(&new_job("a", 0)).unwrap().id;
    q.start(a).unwrap();
    let so_far = JobStats {
        wall_seconds: 1.5,
        generated_tokens: 2,
        ..JobStats::default()
    };
    q.commit_with_stats(a, &Output::text(&[1, 2], 2, "ab"), Some(&so_far))
        .unwrap();
    for run in 1..=5u32 {
        // Killed: nothing is saved at the end of the run.
        q.recover(None).unwrap();
        q.start(a).unwrap();
        let stats = q.job(a).unwrap().stats.unwrap();
        assert_eq!(stats.resumes, run);
        assert_eq!(stats.wall_seconds, 1.5);
    }
}

#[test]
fn only_ended_jobs_can_be_deleted_and_they_take_their_output() {
    let (_dir, q) = queue();
    let id = q.submit(&new_job("a", 0)).unwrap().id;
    assert!(
        matches!(q.delete(id), Err(QueueError::Illegal { .. })),
        "a waiting job stays"
    );
    q.start(id).unwrap();
    q.commit(id, &Output::text(&[1, 2], 2, "ab")).unwrap();
    assert!(
        matches!(q.delete(id), Err(QueueError::Illegal { .. })),
        "a running job stays"
    );
    q.finish(id, &Output::default(), "eos", &JobStats::default())
        .unwrap();
    q.delete(id).unwrap();
    assert!(matches!(q.job(id), Err(QueueError::NoSuchJob(_))));
    assert!(q.list().unwrap().is_empty());
    assert!(matches!(q.delete(id), Err(QueueError::NoSuchJob(_))));
}

#[test]
fn the_admitted_prompt_reaches_the_runner_as_it_was_admitted() {
    let (_dir, q) = queue();
    let ids = vec![0, 7, u32::MAX, 151_643];
    let admitted = q
        .submit(&NewJob {
            prompt_ids: Some(ids.clone()),
            ..new_job("admitted", 0)
        })
        .unwrap();
    let rendered_later = q.submit(&new_job("rendered later", -1)).unwrap();
    let next = q.next_runnable().unwrap().unwrap();
    assert_eq!((next.id, next.prompt_ids), (admitted.id, Some(ids)));
    assert_eq!(q.prompt_ids(rendered_later.id).unwrap(), None);
    assert!(matches!(q.prompt_ids(999), Err(QueueError::NoSuchJob(999))));
}

#[test]
fn a_paused_job_keeps_its_cause_until_it_resumes() {
    let (_dir, q) = queue();
    let id = q.submit(&new_job("held", 0)).unwrap().id;
    q.start(id).unwrap();
    q.pause(id, PauseCause::DriveMissing, "drive missing: /d0")
        .unwrap();
    q.set_pause_reason(id, "its drives are back: resume to continue")
        .unwrap();
    let held = q.job(id).unwrap();
    assert_eq!(held.pause_cause, Some(PauseCause::DriveMissing));
    assert!(held.pause_cause.is_some_and(PauseCause::is_fault));
    q.resume(id).unwrap();
    assert_eq!(q.job(id).unwrap().pause_cause, None);
    for c in [
        PauseCause::User,
        PauseCause::Queue,
        PauseCause::ReadFault,
        PauseCause::Storage,
    ] {
        assert_eq!(PauseCause::parse(c.as_str()), Some(c));
    }
}

/// A job paused on its drives holds its model's other jobs (they would
/// start onto the same failing drives), not other models' jobs, and the
/// hold ends when that job resumes or is cancelled. Resume all resumes
/// every paused job, whatever paused it.
#[test]
fn a_job_paused_on_its_drives_holds_its_model_and_resume_all_frees_every_job() {
    let (_dir, q) = queue();
    q.add_model(&ModelEntry {
        name: "other".into(),
        kind: ModelKind::Local {
            path: "/models/other".into(),
        },
        created_ms: 0,
    })
    .unwrap();
    let first = q.submit(&new_job("first", 0)).unwrap().id;
    let second = q.submit(&new_job("second", 0)).unwrap().id;
    let elsewhere = q
        .submit(&NewJob {
            model: "other".into(),
            ..new_job("elsewhere", 0)
        })
        .unwrap()
        .id;
    q.start(first).unwrap();
    for cause in [PauseCause::ReadFault, PauseCause::DriveMissing] {
        q.pause(first, cause, "storage fault: EIO").unwrap();
        assert_eq!(q.next_runnable().unwrap().map(|j| j.id), Some(elsewhere));
        let held = q.paused_on_drives().unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].id, held[0].cause), (first, cause));
        q.resume(first).unwrap();
        assert_eq!(q.next_runnable().unwrap().map(|j| j.id), Some(first));
        q.start(first).unwrap();
    }
    // A person's pause holds nothing else.
    q.pause(first, PauseCause::User, "asked").unwrap();
    assert_eq!(q.next_runnable().unwrap().map(|j| j.id), Some(second));
    assert!(q.paused_on_drives().unwrap().is_empty());
    q.start(second).unwrap();
    q.pause(second, PauseCause::ReadFault, "storage fault: EIO")
        .unwrap();
    assert_eq!(q.resume_all().unwrap(), vec![first, second]);
    for id in [first, second] {
        let job = q.job(id).unwrap();
        assert_eq!((job.state, job.pause_cause), (JobState::Queued, None));
    }
}

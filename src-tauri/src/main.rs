//! Longhaul's menu-bar app. It holds no logic of its own: the supervisor in
//! `longhaul-service` starts and watches the service and sums up the queue;
//! this shell draws the tray, opens the service's web UI in a window,
//! shows notifications, and opens itself at login when asked (the tray's
//! check item). Closing the window never stops a job; Quit stops the
//! service (asking first while a job runs), and running jobs resume at the
//! next start.

#![cfg_attr(not(debug_assertions), windows_subsystem = "windows")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use longhaul_service::client::DEFAULT_PORT;
use longhaul_service::supervisor::{Supervisor, SupervisorConfig, TrayState};
use tauri::menu::{CheckMenuItem, Menu, MenuItem, PredefinedMenuItem};
use tauri::tray::TrayIconBuilder;
use tauri::{AppHandle, DragDropEvent, Manager, WebviewUrl, WebviewWindowBuilder, WindowEvent};
use tauri_plugin_autostart::{MacosLauncher, ManagerExt};
use tauri_plugin_dialog::{DialogExt, MessageDialogButtons, MessageDialogKind};

/// The tray icon for each state of the queue.
fn tray_icon(state: &TrayState) -> tauri::Result<tauri::image::Image<'static>> {
    tauri::image::Image::from_bytes(match state {
        TrayState::Idle => include_bytes!("../icons/tray-idle.png").as_slice(),
        TrayState::Running => include_bytes!("../icons/tray-running.png").as_slice(),
        TrayState::Paused => include_bytes!("../icons/tray-paused.png").as_slice(),
        TrayState::Error => include_bytes!("../icons/tray-error.png").as_slice(),
    })
}

/// How often the tray is brought up to date.
const STATUS_INTERVAL: Duration = Duration::from_secs(2);
const WINDOW_LABEL: &str = "main";
const TRAY_ID: &str = "longhaul";

/// Where the service keeps its data: `LONGHAUL_DATA_DIR`, else the same default as `longhaul`.
fn data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("LONGHAUL_DATA_DIR").filter(|x| !x.is_empty()) {
        return PathBuf::from(x);
    }
    longhaul_service::client::default_data_dir(
        std::env::var_os("XDG_DATA_HOME"),
        std::env::var_os("HOME"),
    )
}

/// The `longhaul` binary: `LONGHAUL_BIN`, else beside this app.
fn service_binary() -> anyhow::Result<PathBuf> {
    if let Some(b) = std::env::var_os("LONGHAUL_BIN") {
        return Ok(PathBuf::from(b));
    }
    let exe = std::env::current_exe().context("cannot find this program's path")?;
    let name = if cfg!(windows) {
        "longhaul.exe"
    } else {
        "longhaul"
    };
    Ok(exe.with_file_name(name))
}

fn config() -> anyhow::Result<SupervisorConfig> {
    let port = match std::env::var("LONGHAUL_PORT") {
        Ok(p) => p.parse().context("LONGHAUL_PORT must be a port number")?,
        Err(_) => DEFAULT_PORT,
    };
    Ok(SupervisorConfig {
        binary: service_binary()?,
        data_dir: data_dir(),
        port,
        serve_args: Vec::new(),
    })
}

/// Shows `body` as a system notification.
#[cfg(feature = "notifications")]
fn notify(handle: &AppHandle, body: &str) {
    use tauri_plugin_notification::NotificationExt;
    let shown = handle
        .notification()
        .builder()
        .title("Longhaul")
        .body(body)
        .show();
    if let Err(e) = shown {
        tracing::warn!("cannot show a notification: {e}");
    }
}

/// Without notifications (see the crate's features), the log says it.
#[cfg(not(feature = "notifications"))]
fn notify(_: &AppHandle, body: &str) {
    tracing::info!("{body}");
}

/// Shows the window (creating it the first time), at `route` of the UI.
fn open_window(app: &AppHandle, sup: &Supervisor, route: &str) -> tauri::Result<()> {
    let Some(base) = sup.ui_url() else {
        return Ok(());
    };
    // The first load carries the token; the UI keeps it and moves to its route.
    let url = if route.is_empty() {
        base
    } else {
        format!("{}#/{route}", base.split('#').next().unwrap_or(&base))
    };
    let parsed: tauri::Url = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            tracing::error!("bad service address {url}: {e}");
            return Ok(());
        }
    };
    if let Some(w) = app.get_webview_window(WINDOW_LABEL) {
        if !route.is_empty() {
            w.navigate(parsed)?;
        }
        w.show()?;
        w.set_focus()?;
        return Ok(());
    }
    let window = WebviewWindowBuilder::new(app, WINDOW_LABEL, WebviewUrl::External(parsed))
        .title("Longhaul")
        .inner_size(1280.0, 860.0)
        .min_inner_size(720.0, 520.0)
        .on_document_title_changed(|window, title| {
            let _ = window.set_title(&title);
        })
        .build()?;
    // Files dropped on the window become the task's attachments: the page
    // gets their paths (a browser would only give it their contents).
    let target = window.clone();
    window.on_window_event(move |event| {
        let WindowEvent::DragDrop(drop) = event else {
            return;
        };
        let message = match drop {
            DragDropEvent::Enter { paths, .. } => {
                serde_json::json!({ "kind": "enter", "paths": paths })
            }
            DragDropEvent::Drop { paths, .. } => {
                serde_json::json!({ "kind": "drop", "paths": paths })
            }
            DragDropEvent::Leave => serde_json::json!({ "kind": "leave", "paths": [] }),
            _ => return,
        };
        if let Err(e) = target.eval(format!(
            "window.longhaulDrop && window.longhaulDrop({message})"
        )) {
            tracing::warn!("cannot pass dropped files to the page: {e}");
        }
    });
    Ok(())
}

/// Turns opening at login on or off; the check mark then shows what the
/// system says, whether or not the change took.
fn toggle_login(app: &AppHandle, item: &CheckMenuItem<tauri::Wry>) {
    let launcher = app.autolaunch();
    let was = launcher.is_enabled().unwrap_or(false);
    let changed = if was {
        launcher.disable()
    } else {
        launcher.enable()
    };
    if let Err(e) = changed {
        tracing::error!("cannot change opening at login: {e}");
    }
    let _ = item.set_checked(launcher.is_enabled().unwrap_or(was));
}

/// Quits, first asking when that would stop a running task.
fn quit_asking(app: &AppHandle, sup: &Arc<Supervisor>) {
    let Some(question) = sup.quit_question() else {
        sup.shutdown();
        app.exit(0);
        return;
    };
    let (app, sup) = (app.clone(), Arc::clone(sup));
    app.clone()
        .dialog()
        .message(question)
        .title("Quit Longhaul?")
        .kind(MessageDialogKind::Warning)
        .buttons(MessageDialogButtons::OkCancelCustom(
            "Quit".into(),
            "Keep running".into(),
        ))
        .show(move |quit| {
            if quit {
                sup.shutdown();
                app.exit(0);
            }
        });
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let sup = Arc::new(Supervisor::start(config()?).context("cannot start the Longhaul service")?);
    if sup.run_demo_on_first_start() {
        tracing::info!("first start: running the demo");
    }
    // Opening at login: a LaunchAgent on macOS (a login item the user sees
    // in System Settings), an autostart entry on Linux.
    let builder = tauri::Builder::default()
        .plugin(tauri_plugin_dialog::init())
        .plugin(tauri_plugin_autostart::init(
            MacosLauncher::LaunchAgent,
            None,
        ));
    #[cfg(feature = "notifications")]
    let builder = builder.plugin(tauri_plugin_notification::init());
    let app = builder
        .setup({
            let sup = Arc::clone(&sup);
            move |app| {
                #[cfg(target_os = "macos")]
                app.set_activation_policy(tauri::ActivationPolicy::Accessory);
                // The status as the menu's first line: tray tooltips are not
                // shown everywhere (Linux).
                let line = MenuItem::with_id(app, "status", "Longhaul", false, None::<&str>)?;
                let open = MenuItem::with_id(app, "open", "Open Longhaul", true, None::<&str>)?;
                let new = MenuItem::with_id(app, "new", "New task…", true, None::<&str>)?;
                let pause = MenuItem::with_id(app, "pause", "Pause queue", true, None::<&str>)?;
                let at_login = app.autolaunch().is_enabled().unwrap_or(false);
                let login = CheckMenuItem::with_id(
                    app,
                    "login",
                    "Open at login",
                    true,
                    at_login,
                    None::<&str>,
                )?;
                let quit = MenuItem::with_id(app, "quit", "Quit Longhaul", true, None::<&str>)?;
                let sep = PredefinedMenuItem::separator(app)?;
                let top = PredefinedMenuItem::separator(app)?;
                let menu = Menu::with_items(
                    app,
                    &[&line, &top, &open, &new, &pause, &sep, &login, &quit],
                )?;
                let icon = tray_icon(&TrayState::Idle)?;
                let on_menu = Arc::clone(&sup);
                let tray = TrayIconBuilder::with_id(TRAY_ID)
                    .icon(icon)
                    .menu(&menu)
                    .tooltip("Longhaul")
                    .on_menu_event(move |app, event| {
                        let result = match event.id().as_ref() {
                            "open" => open_window(app, &on_menu, ""),
                            "new" => open_window(app, &on_menu, "new"),
                            "pause" => {
                                let paused = on_menu.status().queue_paused;
                                if let Err(e) = on_menu.set_queue_paused(!paused) {
                                    tracing::error!("cannot change the queue: {e}");
                                }
                                Ok(())
                            }
                            "login" => {
                                toggle_login(app, &login);
                                Ok(())
                            }
                            "quit" => {
                                quit_asking(app, &on_menu);
                                Ok(())
                            }
                            _ => Ok(()),
                        };
                        if let Err(e) = result {
                            tracing::error!("tray action failed: {e}");
                        }
                    })
                    .build(app)?;
                tracing::info!("tray icon ready");

                // Keep the tray current, the service alive, and say when jobs end.
                let handle = app.handle().clone();
                let watcher = Arc::clone(&sup);
                std::thread::spawn(move || {
                    let mut shown: Option<TrayState> = None;
                    loop {
                        if let Err(e) = watcher.keep_alive() {
                            tracing::error!("{e}");
                        }
                        let status = watcher.status();
                        if shown.as_ref() != Some(&status.state) {
                            match tray_icon(&status.state) {
                                Ok(icon) => {
                                    let _ = tray.set_icon(Some(icon));
                                }
                                Err(e) => tracing::warn!("tray icon: {e}"),
                            }
                            shown = Some(status.state.clone());
                        }
                        let _ = tray.set_tooltip(Some(&status.text));
                        let _ = tray.set_title(Some(&status.title));
                        let _ = line.set_text(&status.text);
                        let _ = pause.set_text(if status.queue_paused {
                            "Resume queue"
                        } else {
                            "Pause queue"
                        });
                        let told = status.ended.iter().map(|(_, title, state)| {
                            longhaul_service::supervisor::notice(title, state)
                        });
                        for body in told.chain(status.health) {
                            notify(&handle, &body);
                        }
                        std::thread::sleep(STATUS_INTERVAL);
                    }
                });
                open_window(app.handle(), &sup, "")?;
                Ok(())
            }
        })
        .on_page_load(|_, payload| {
            tracing::info!("page {:?}: {}", payload.event(), payload.url().path());
        })
        .on_window_event(|window, event| {
            // Closing the window hides it; jobs go on in the service.
            if let WindowEvent::CloseRequested { api, .. } = event {
                api.prevent_close();
                let _ = window.hide();
            }
        })
        .build(tauri::generate_context!())
        .context("cannot start the desktop shell")?;
    app.run(|_, event| {
        if let tauri::RunEvent::ExitRequested {
            code: None, api, ..
        } = event
        {
            // The last window closing does not quit: the tray stays.
            api.prevent_exit();
        }
    });
    sup.shutdown();
    Ok(())
}

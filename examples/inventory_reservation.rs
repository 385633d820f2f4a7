//! The idem demo: a coordinator on embedded SQLite and three participant services
//! (inventory, payment, coupon), each with its own SQLite database, all on loopback in
//! this one process. It places a few orders through the typed client (`idem-client`) and
//! prints what became of them.
//!
//!     cargo run --example inventory_reservation

use std::time::Duration;

use idem::server::{self, ServerConfig};
use idem_client::{Client, TryOutcome, TxView};
use idem_demo::{coupon, inventory, payment};
use serde_json::json;

type Error = Box<dyn std::error::Error + Send + Sync>;

struct Demo {
    idem: Client,
    inventory: String,
    payment: String,
    coupon: String,
}

impl Demo {
    /// A TCC order: register each branch with idem, which calls its Try; if every Try
    /// succeeded, submit (idem Confirms everywhere), else abort (idem Cancels everywhere).
    async fn tcc_order(
        &self,
        gid: &str,
        sku: &str,
        quantity: i64,
        account: &str,
        amount: i64,
    ) -> Result<TxView, Error> {
        let tcc = self.idem.tcc(gid).create().await?;
        let branches = [
            (
                "payment",
                &self.payment,
                json!({"account": account, "amount": amount}),
            ),
            (
                "inventory",
                &self.inventory,
                json!({"sku": sku, "quantity": quantity}),
            ),
        ];
        let mut refused = None;
        for (id, url, payload) in branches {
            let tried = tcc.register_with_try(id, url, url, url, payload).await?;
            println!("    Try {id:<9} -> {}", tried.label());
            if tried != TryOutcome::Succeeded {
                refused = Some(format!("{id}: {}", tried.detail().unwrap_or("")));
                break;
            }
        }
        let tx = match refused {
            None => tcc.submit(true).await?,
            Some(why) => {
                tcc.abort(Some(&format!("Try refused by {why}")), true)
                    .await?
            }
        };
        Ok(tx)
    }

    /// A saga order: sell the stock, then issue a coupon; if the coupon step fails, the
    /// sale is compensated (the stock comes back).
    async fn saga_order(
        &self,
        gid: &str,
        sku: &str,
        user: &str,
        campaign: &str,
    ) -> Result<TxView, Error> {
        let tx = self
            .idem
            .saga(gid)
            .step(
                &self.inventory,
                &self.inventory,
                json!({"sku": sku, "quantity": 1}),
            )
            .step(
                &self.coupon,
                &self.coupon,
                json!({"user": user, "coupon": campaign}),
            )
            .wait_result(true)
            .create()
            .await?;
        Ok(tx)
    }
}

fn report(title: &str, tx: &TxView) {
    let reason = tx
        .reason
        .as_ref()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    println!("  => {title}: {}{reason}", tx.status);
    for b in &tx.branches {
        if b.status != idem_client::BranchStatus::Pending {
            println!(
                "       {:>9} {:<10} {}",
                b.branch_id,
                b.action.as_str(),
                b.status
            );
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let sqlite = |name: &str| format!("sqlite://{}?mode=rwc", dir.join(name).display());

    let mut config = ServerConfig::new(sqlite("coordinator.db"), "127.0.0.1:0".parse()?);
    config.engine.defaults.retry_interval_ms = 200;
    config.wait_timeout = Duration::from_secs(10);
    let coordinator = server::start(config).await?;

    let inventory_db = inventory::open(&sqlite("inventory.db")).await?;
    let payment_db = payment::open(&sqlite("payment.db")).await?;
    let coupon_db = coupon::open(&sqlite("coupon.db")).await?;
    inventory::seed(&inventory_db, "apple", 5).await?;
    for (account, balance) in [("alice", 100), ("bob", 80), ("dave", 50), ("erin", 50)] {
        payment::seed(&payment_db, account, balance).await?;
    }
    coupon::seed(&coupon_db, "WELCOME10", 1).await?;
    let inventory_svc = inventory::start(inventory_db.clone(), "127.0.0.1:0").await?;
    let payment_svc = payment::start(payment_db.clone(), "127.0.0.1:0").await?;
    let coupon_svc = coupon::start(coupon_db.clone(), "127.0.0.1:0").await?;

    idem::transport::install_crypto_provider();
    let demo = Demo {
        idem: Client::new(&coordinator.url())?,
        inventory: inventory_svc.url(inventory::RESERVE_PATH),
        payment: payment_svc.url(payment::FREEZE_PATH),
        coupon: coupon_svc.url(coupon::ISSUE_PATH),
    };
    println!(
        "coordinator {} | inventory {} | payment {} | coupon {}",
        coordinator.url(),
        inventory_svc.addr(),
        payment_svc.addr(),
        coupon_svc.addr()
    );
    println!(
        "stock: 5 apples; balances: alice 100, bob 80, dave 50, erin 50; coupons: 1 x WELCOME10\n"
    );

    println!("order-1: alice buys 2 apples for 30 (TCC)");
    let tx = demo.tcc_order("order-1", "apple", 2, "alice", 30).await?;
    report("order-1", &tx);

    println!("\norder-2: bob buys 10 apples for 50 (TCC): not enough stock");
    let tx = demo.tcc_order("order-2", "apple", 10, "bob", 50).await?;
    report("order-2", &tx);

    println!("\norder-3: dave buys 1 apple and gets the last WELCOME10 coupon (saga)");
    let tx = demo
        .saga_order("order-3", "apple", "dave", "WELCOME10")
        .await?;
    report("order-3", &tx);

    println!(
        "\norder-4: erin buys 1 apple, but the coupons are gone (saga): the sale is compensated"
    );
    let tx = demo
        .saga_order("order-4", "apple", "erin", "WELCOME10")
        .await?;
    report("order-4", &tx);

    println!("\nfinal state");
    let apple = inventory::stock(&inventory_db, "apple")
        .await?
        .expect("seeded");
    println!(
        "  apple: available {}, reserved {}, sold {}",
        apple.available, apple.reserved, apple.sold
    );
    for b in payment::balances(&payment_db).await? {
        println!(
            "  {:<6} balance {:>3}, frozen {}",
            b.account, b.balance, b.frozen
        );
    }
    for user in ["dave", "erin"] {
        let coupons = coupon::coupons_of(&coupon_db, user).await?;
        let list: Vec<String> = coupons
            .iter()
            .map(|c| format!("{} ({})", c.code, c.status))
            .collect();
        println!(
            "  coupons of {user}: {}",
            if list.is_empty() {
                "none".into()
            } else {
                list.join(", ")
            }
        );
    }

    coordinator.stop().await?;
    for svc in [inventory_svc, payment_svc, coupon_svc] {
        svc.stop().await?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

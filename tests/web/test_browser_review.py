"""The finance review in a real browser: headless Chromium (Debian's, driven by Playwright) against
`compensator run`, the launcher behind `make run`, on free ports with its data in a temporary
folder, its banner read for the review URL and the demo reviewer's and approver's logins.

The dead letters are made for real: transfers submitted through the API with the banner's producer
token while the payment stand-in refuses every transfer (`PUT /_faults {"permanent_rate": 1.0}`,
insufficient funds: a permanent error), then the stand-in is made healthy again. What a person does
next is done through the pages only; the API is read to see that the worker really paid.

- a reviewer logs in, filters, opens a dead letter, is refused an invalid edit (the field named),
  makes a valid one and so proposes it (a transfer moves money: four eyes); the approver approves it
  in the inbox, the worker pays the new version through the stand-in, and the audit view shows both;
- an edit of the amount, the currency and the payee: the approver sees the figures that will be paid,
  in money terms, beside the old ones, approves, and the worker pays exactly those;
- a discard with a reason code and a comment, proposed and approved;
- a bulk redrive by filter: its dry run's count and totals, proposed, approved, the job's per-item
  results, every request paid;
- a viewer sees account numbers masked.

Screenshots of every page (login, list, detail as a reviewer and as a viewer, edit, dry run,
approvals, jobs, job, audit, a request that is not there) go to $COMPENSATOR_SCREENSHOTS (CI keeps
them as artifacts; docs/screenshots/ has a set), else to a pytest temporary folder.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest
from browser_support import ROOT, SCREENSHOTS_ENV, Api, Banner, LocalRun, Login, child_env, chromium_path, local_run
from playwright.sync_api import Browser, Page, expect, sync_playwright

pytestmark = pytest.mark.slow

EXPECT_TIMEOUT_MS: Final = 15_000
PAID_TIMEOUT_S: Final = 30.0
PAYER: Final = "acct-6222020012345678"
PAYEE: Final = "acct-6222020087654321"
BACKUP_PAYER: Final = "acct-6222020099990000"
EDIT_REF: Final = "rp-edit-1"
MONEY_REF: Final = "rp-money-1"
NEW_PAYEE: Final = "acct-6222020077778888"
DISCARD_REF: Final = "rp-discard-1"
BULK_REF: Final = "rp-bulk-1"
BULK_AMOUNTS: Final = (100, 250, 1000)
VIEWER: Final = Login("fin-viewer", "viewer-password-1234")


@dataclass(frozen=True, slots=True)
class Review:
    """The running service, the dead letters made for the scenarios, and one browser."""

    run: LocalRun
    banner: Banner
    api: Api
    browser: Browser
    origin: str
    dead: dict[str, list[str]]
    """Ref key -> the ids of its dead letters."""
    shots: Path


def _transfer(n: int, amount_minor: int, currency: str = "CNY") -> dict[str, Any]:
    return {"transfer_id": f"tr-browser-{n}", "payer": PAYER, "payee": PAYEE, "amount_minor": amount_minor,
            "currency": currency}  # fmt: skip


def _json(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2)


def make_dead_letters(api: Api) -> dict[str, list[str]]:
    """Transfers refused by the payment stand-in for lack of funds: dead letters on their first attempt."""
    plan = [(EDIT_REF, 1250, "CNY"), (DISCARD_REF, 4200, "CNY"), (MONEY_REF, 6000, "USD"),
            *((BULK_REF, amount, "CNY") for amount in BULK_AMOUNTS)]  # fmt: skip
    api.payment_faults({"permanent_rate": 1.0})
    try:
        made = [
            (ref, api.submit_transfer(f"browser-{n}", ref, _transfer(n, amount, currency)))
            for n, (ref, amount, currency) in enumerate(plan)
        ]
        for _, request_id in made:
            view = api.wait_state(request_id, "dead")
            assert view["last_error"]["error_class"] == "insufficient_funds", view
    finally:
        api.payment_faults({})
    dead: dict[str, list[str]] = {}
    for ref, request_id in made:
        dead.setdefault(ref, []).append(request_id)
    return dead


def add_viewer(run: LocalRun) -> None:
    """A viewer, added the way an admin adds one: `compensator user add`, the password on stdin."""
    done = subprocess.run(
        [sys.executable, "-m", "compensator", "user", "add", "--name", VIEWER.name, "--role", "viewer",
         "--actor", "browser-test", "--reason", "read-only finance colleague"],
        cwd=ROOT, env=child_env(run.env), input=VIEWER.password + "\n", capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def review(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Review]:
    chromium = chromium_path()  # fails at once, before anything starts, without the browser
    shots = Path(os.environ.get(SCREENSHOTS_ENV) or tmp_path_factory.mktemp("screenshots"))
    shots.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with local_run() as (run, banner):
        api = Api(banner)
        try:
            dead = make_dead_letters(api)
            add_viewer(run)
            print(
                f"\nservice up and {sum(map(len, dead.values()))} dead letters made in {time.monotonic() - started:.1f} s"
            )
            with sync_playwright() as playwright:
                playwright.selectors.set_test_id_attribute("data-test")
                expect.set_options(timeout=EXPECT_TIMEOUT_MS)  # 5 s is short on a busy 2-core machine
                browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
                try:
                    origin = banner.review_url.removesuffix("/review")
                    yield Review(run, banner, api, browser, origin, dead, shots)
                finally:
                    browser.close()
        finally:
            api.close()


# ---- what a person does ------------------------------------------------------------------------


def log_in(review: Review, login: Login, *, shot: str = "") -> Page:
    """A fresh browser context (its own cookies), the login page (its screenshot taken as `shot`),
    the name and password typed."""
    context = review.browser.new_context(base_url=review.origin, viewport={"width": 1360, "height": 900})
    context.set_default_timeout(EXPECT_TIMEOUT_MS)
    page = context.new_page()
    page.goto("/review/login")
    if shot:
        screenshot(review, page, shot)
    page.get_by_test_id("login-name").fill(login.name)
    page.get_by_test_id("login-password").fill(login.password)
    page.get_by_test_id("login-submit").click()
    expect(page.get_by_test_id("current-user")).to_contain_text(login.name)
    return page


def log_out(page: Page) -> None:
    page.get_by_test_id("logout").click()
    expect(page.get_by_test_id("login-form")).to_be_visible()
    page.context.close()


def screenshot(review: Review, page: Page, name: str) -> None:
    page.screenshot(path=review.shots / f"{name}.png", full_page=True)


def flash(page: Page, kind: str) -> str:
    message = page.locator(f'[data-test="flash"][data-kind="{kind}"]')
    expect(message).to_be_visible()
    return message.inner_text()


def filter_dead_letters(page: Page, *, kind: str = "", ref_key: str = "") -> None:
    page.get_by_test_id("nav-dead-letters").click()
    page.get_by_test_id("filter-kind").select_option(kind)
    page.get_by_test_id("filter-ref-key").fill(ref_key)
    page.get_by_test_id("filter-apply").click()
    expect(page).to_have_url(re.compile(rf"[?&]ref_key={re.escape(ref_key)}(&|$)"))  # htmx pushes it once swapped


def rows(page: Page) -> list[str]:
    return [row.get_attribute("data-id") or "" for row in page.get_by_test_id("dead-letter-row").all()]


def expect_rows(page: Page, ids: list[str]) -> None:
    """The list shows exactly these dead letters (htmx swaps the results in)."""
    locator = page.get_by_test_id("dead-letter-row")
    expect(locator).to_have_count(len(ids))
    assert sorted(rows(page)) == sorted(ids)


def approve(
    review: Review, login: Login, target: str, *, action: str, note: str, shows: str = "", shot: str = ""
) -> Page:
    """The approver's inbox: the pending proposal naming `target` (showing `shows`; its screenshot
    taken as `shot`), approved with a note."""
    page = log_in(review, login)
    page.get_by_test_id("nav-approvals").click()
    proposal = page.locator(f'[data-test="proposal"][data-action="{action}"][data-state="pending"]').filter(
        has=page.locator(f'[data-test="proposal-targets"] a[href="/review/requests/{target}"]')
    )
    expect(proposal).to_have_count(1)
    expect(proposal).to_contain_text(shows)
    if shot:
        screenshot(review, page, shot)
    proposal.get_by_test_id("approve-reason").fill(note)
    proposal.get_by_test_id("approve-submit").click()
    return page


# ---- the scenarios -----------------------------------------------------------------------------


def test_a_reviewer_edits_a_dead_transfer_an_approver_approves_it_and_the_worker_pays_the_new_version(
    review: Review,
) -> None:
    started = time.monotonic()
    (original,) = review.dead[EDIT_REF]
    reviewer, approver = review.banner.reviewer, review.banner.approver
    page = log_in(review, reviewer, shot="login")
    page.get_by_test_id("nav-dead-letters").click()
    expect(page.locator(f'[data-test="dead-letter-row"][data-id="{original}"]')).to_be_visible()
    expect(page.get_by_test_id("redrive-selected-dry-run")).to_contain_text("Propose a redrive of the selected")
    screenshot(review, page, "dead-letters")

    filter_dead_letters(page, kind="transfer", ref_key=EDIT_REF)
    expect_rows(page, [original])
    expect(page.get_by_test_id("summary-count")).to_have_text("1")
    page.locator(f'[data-test="dead-letter-row"][data-id="{original}"]').get_by_test_id("row-link").click()
    expect(page.get_by_test_id("request-id")).to_contain_text(original)
    expect(page.get_by_test_id("request-state")).to_have_text("dead")
    expect(page.get_by_test_id("attempt-row")).to_have_count(1)
    expect(page.get_by_test_id("attempt-excerpt")).to_contain_text("insufficient_funds")
    expect(page.get_by_test_id("redrive-submit")).to_have_text("Propose a redrive")  # a transfer: four eyes
    screenshot(review, page, "detail")

    # an invalid edit: refused, the field named, nothing stored
    page.get_by_test_id("edit-link").click()
    payload = page.get_by_test_id("edit-payload")
    edited = _transfer(0, 1250) | {"payer": BACKUP_PAYER}
    payload.fill(_json(edited | {"amount_minor": -5}))
    page.get_by_test_id("edit-reason").fill("escrow account short of funds: pay from the backup escrow")
    page.get_by_test_id("edit-preview").click()
    refused = page.locator('[data-test="field-error"][data-field="payload.amount_minor"]')
    expect(refused).to_be_visible()
    expect(refused).to_contain_text("amount_minor")  # named where the person reads it, not only in an attribute
    expect(page.get_by_test_id("edit-submit")).to_have_count(0)
    assert review.api.request(original)["state"] == "dead"

    # a valid edit: the diff, then a proposal (a transfer moves money: four eyes)
    page.get_by_test_id("edit-payload").fill(_json(edited))
    page.get_by_test_id("edit-preview").click()
    diff = page.locator('[data-test="diff-row"]')
    expect(diff).to_have_count(1)
    expect(diff).to_have_attribute("data-field", "payer")
    expect(page.get_by_test_id("edit-submit")).to_have_text("Propose a redrive as a new version")
    screenshot(review, page, "edit")
    page.get_by_test_id("edit-submit").click()
    flash(page, "proposed")
    assert review.api.request(original)["state"] == "dead"  # nothing done before the second person
    log_out(page)

    page = approve(
        review,
        approver,
        original,
        action="edit_redrive",
        note="checked against the escrow statement",
        shows=f'payer "{PAYER}" → "{BACKUP_PAYER}"',
        shot="approvals",
    )
    flash(page, "success")
    superseded = review.api.request(original)
    assert superseded["state"] == "discarded" and superseded["superseded_by"], superseded
    new_id = superseded["superseded_by"]
    paid = review.api.wait_state(new_id, "done", timeout_s=PAID_TIMEOUT_S)
    assert paid["payload"]["payer"] == BACKUP_PAYER and paid["attempts"] == 1, paid
    page.goto(f"/review/requests/{new_id}")
    expect(page.get_by_test_id("request-state")).to_have_text("done")

    page.get_by_test_id("nav-audit").click()
    audit = page.get_by_test_id("audit-entry")
    expect(audit.first).to_be_visible()
    proposed = page.locator(f'[data-test="audit-entry"][data-action="propose"][data-actor="{reviewer.name}"]')
    approved = page.locator(f'[data-test="audit-entry"][data-action="approve"][data-actor="{approver.name}"]')
    edit = page.locator('[data-test="audit-entry"][data-action="edit_redrive"]')
    expect(proposed.first).to_be_visible()
    expect(approved.first).to_be_visible()
    expect(
        edit.filter(has=page.locator(f'[data-test="audit-request-link"][href="/review/requests/{original}"]'))
    ).to_have_count(1)
    screenshot(review, page, "audit")
    log_out(page)

    page = log_in(review, VIEWER)  # the edit's entry holds the payload before and after: masked for a viewer
    page.get_by_test_id("nav-audit").click()
    expect(page.locator('[data-test="audit-entry"][data-action="edit_redrive"]')).to_have_count(1)
    audit = page.get_by_test_id("audit-table").inner_text()
    assert not any(account in audit for account in (PAYER, PAYEE, BACKUP_PAYER)), audit
    assert re.search(r"\*+" + BACKUP_PAYER[-4:], audit), audit
    page.context.close()
    print(f"\nedit, approval and payment in the browser: {time.monotonic() - started:.1f} s")


def test_an_edit_of_amount_currency_and_payee_is_approved_on_the_figures_that_will_be_paid(review: Review) -> None:
    """60.00 USD to the old payee becomes 99,999.00 EUR to a new one: the reviewer's preview says
    what the new version pays, and the approver's card shows 99,999.00 EUR (beside 60.00 USD, never
    instead of it), the new payee, and the amount as money in the diff, before approving."""
    (original,) = review.dead[MONEY_REF]
    page = log_in(review, review.banner.reviewer)
    page.goto(f"/review/requests/{original}/edit")
    edited = _transfer(2, 9_999_900, "EUR") | {"payee": NEW_PAYEE}  # 2: its place in make_dead_letters' plan
    page.get_by_test_id("edit-payload").fill(_json(edited))
    page.get_by_test_id("edit-reason").fill("the customer asked to be paid in EUR to their new account")
    page.get_by_test_id("edit-preview").click()
    expect(page.get_by_test_id("edit-pays")).to_have_text("99,999.00 EUR")
    expect(page.get_by_test_id("edit-pays-before")).to_have_text("60.00 USD")
    expect(page.locator('[data-test="diff-row"][data-field="amount"]')).to_contain_text("60.00 USD")
    page.get_by_test_id("edit-submit").click()
    flash(page, "proposed")
    log_out(page)

    page = log_in(review, review.banner.approver)
    page.get_by_test_id("nav-approvals").click()
    card = page.locator('[data-test="proposal"][data-action="edit_redrive"][data-state="pending"]').filter(
        has=page.locator(f'[data-test="proposal-targets"] a[href="/review/requests/{original}"]')
    )
    expect(card).to_have_count(1)
    expect(card.get_by_test_id("proposal-total")).to_have_text("99,999.00 EUR")
    expect(card.get_by_test_id("proposal-total")).to_have_attribute("data-currency", "EUR")
    expect(card.get_by_test_id("proposal-total-before")).to_have_text("60.00 USD")
    expect(card.get_by_test_id("proposal-payment")).to_contain_text("99,999.00 EUR")
    expect(card.locator('[data-test="proposal-diff-row"][data-field="amount"]')).to_contain_text("60.00 USD → 99,999.00 EUR")
    expect(card.locator('[data-test="proposal-diff-row"][data-field="payee"]')).to_contain_text(NEW_PAYEE)
    screenshot(review, page, "approvals-money")
    card.get_by_test_id("approve-reason").fill("customer's request FIN-3141 checked")
    card.get_by_test_id("approve-submit").click()
    flash(page, "success")
    new_id = review.api.request(original)["superseded_by"]
    paid = review.api.wait_state(new_id, "done", timeout_s=PAID_TIMEOUT_S)
    assert (paid["payload"]["amount_minor"], paid["payload"]["currency"], paid["payload"]["payee"]) == (
        9_999_900, "EUR", NEW_PAYEE)  # what was shown is what was paid
    page.context.close()


def test_a_discard_needs_a_reason_code_and_a_comment_and_an_approval(review: Review) -> None:
    (target,) = review.dead[DISCARD_REF]
    page = log_in(review, review.banner.reviewer)
    page.goto(f"/review/requests/{target}")
    expect(page.get_by_test_id("request-state")).to_have_text("dead")
    page.get_by_test_id("discard-reason-code").select_option("paid_manually")
    page.get_by_test_id("discard-comment").fill("paid by bank transfer on the customer's call, ticket FIN-2231")
    page.get_by_test_id("discard-submit").click()
    flash(page, "proposed")
    assert review.api.request(target)["state"] == "dead"
    log_out(page)

    page = approve(review, review.banner.approver, target, action="discard", note="bank statement attached to FIN-2231")
    flash(page, "success")
    assert review.api.request(target)["state"] == "discarded"
    page.goto(f"/review/requests/{target}")
    expect(page.get_by_test_id("request-state")).to_have_text("discarded")
    expect(page.locator('[data-test="audit-entry"][data-action="discarded"]')).to_contain_text("paid_manually")
    page.context.close()


def test_a_bulk_redrive_by_filter_dry_run_proposal_approval_and_per_item_results(review: Review) -> None:
    started = time.monotonic()
    targets = review.dead[BULK_REF]
    page = log_in(review, review.banner.reviewer)
    filter_dead_letters(page, kind="transfer", ref_key=BULK_REF)
    expect_rows(page, targets)
    total = page.locator('[data-test="summary-total"][data-currency="CNY"]')
    expect(total).to_have_attribute("data-amount-minor", str(sum(BULK_AMOUNTS)))
    expect(total).to_have_attribute("data-count", str(len(targets)))

    page.get_by_test_id("redrive-filter-dry-run").click()
    expect(page.get_by_test_id("dry-run-count")).to_have_text(str(len(targets)))
    dry_total = page.locator('[data-test="dry-run-total"][data-currency="CNY"]')
    expect(dry_total).to_have_attribute("data-amount-minor", str(sum(BULK_AMOUNTS)))
    expect(dry_total).to_contain_text(money_cny(sum(BULK_AMOUNTS)))
    expect(page.get_by_test_id("dry-run-needs-approval")).to_be_visible()
    expect(page.locator('[data-test="dry-run-filter"][data-field="ref_key"]')).to_have_text(BULK_REF)
    screenshot(review, page, "dry-run")
    assert all(review.api.request(i)["state"] == "dead" for i in targets)  # a dry run does nothing
    page.get_by_test_id("confirm-reason").fill("escrow topped up: pay the red packet's transfers again")
    page.get_by_test_id("confirm-submit").click()
    expect(page.get_by_test_id("proposal-link")).to_be_visible()
    assert all(review.api.request(i)["state"] == "dead" for i in targets)
    log_out(page)

    page = approve(review, review.banner.approver, targets[0], action="redrive_job", note="escrow statement checked")
    flash(page, "success")
    page.get_by_test_id("nav-jobs").click()
    job = page.get_by_test_id("job-row").first
    expect(job).to_be_visible()
    screenshot(review, page, "jobs")
    job.get_by_test_id("job-link").click()
    expect(page.get_by_test_id("job-state")).to_have_text("done", timeout=PAID_TIMEOUT_S * 1000)  # htmx polls it
    expect(page.get_by_test_id("job-redriven")).to_have_text(str(len(targets)))
    expect(page.get_by_test_id("job-total")).to_have_text(str(len(targets)))
    page.reload()
    items = page.get_by_test_id("job-item")
    expect(items).to_have_count(len(targets))
    assert sorted((item.get_attribute("data-id"), item.get_attribute("data-result")) for item in items.all()) == sorted(
        (request_id, "redriven") for request_id in targets
    )
    for request_id in targets:
        review.api.wait_state(request_id, "done", timeout_s=PAID_TIMEOUT_S)
    screenshot(review, page, "job")
    page.context.close()
    print(f"\nbulk redrive by filter in the browser: {time.monotonic() - started:.1f} s")


def money_cny(amount_minor: int) -> str:
    """As finance reads it: major units, two decimals for CNY."""
    return f"{amount_minor // 100:,}.{amount_minor % 100:02d} CNY"


def test_a_viewer_sees_account_numbers_masked(review: Review) -> None:
    (target,) = review.dead[DISCARD_REF]
    page = log_in(review, VIEWER)
    page.goto(f"/review/requests/{target}")
    payload = page.get_by_test_id("payload").inner_text()
    assert PAYER not in payload and PAYEE not in payload, payload
    assert re.search(r"\*+" + PAYER[-4:], payload) and re.search(r"\*+" + PAYEE[-4:], payload), payload
    expect(page.get_by_test_id("edit-link")).to_have_count(0)
    expect(page.get_by_test_id("discard-form")).to_have_count(0)
    screenshot(review, page, "detail-viewer")
    page.goto("/review/requests/1-999999")
    expect(page.locator('[data-test="flash"][data-kind="error"]')).to_be_visible()
    screenshot(review, page, "not-found")
    page.context.close()

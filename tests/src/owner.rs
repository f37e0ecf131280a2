//! An owner in the dashboard over plain HTTP (no browser): accepts an invitation, then keeps the
//! session cookie and the page's form key, as a browser would. For the scoping tests, which try
//! every page and endpoint as another owner.

use std::time::Duration;

use reqwest::{Client, StatusCode};

use crate::platform::TestPlatform;
use gpum_platform::web::{LOGIN_COOKIE, SESSION_COOKIE};

/// A signed-in owner: their session cookie and form key.
pub struct OwnerSession {
    client: Client,
    base: String,
    pub session: String,
    pub csrf: String,
}

/// An answer: status, `Location`, body.
pub struct Page {
    pub status: StatusCode,
    pub location: Option<String>,
    pub body: String,
}

fn client(p: &TestPlatform) -> Client {
    // No kept connections: a test restarts the platform under a session.
    let mut b = Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(20));
    if let Some(pem) = p.ca_pem() {
        b = b
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).expect("CA PEM"));
    }
    b.build().expect("client")
}

fn set_cookie(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get_all("set-cookie").iter().find_map(|v| {
        let v = v.to_str().ok()?;
        Some(v.split(';').next()?.strip_prefix(name)?.strip_prefix('=')?.to_owned())
    })
}

/// The value of the first `name="csrf" value="…"` on a page.
pub fn form_key(page: &str) -> Option<String> {
    Some(page.split("name=\"csrf\" value=\"").nth(1)?.split('"').next()?.to_owned())
}

impl OwnerSession {
    /// Opens the invitation link, sets `password`, and keeps the session it starts.
    pub async fn accept(p: &TestPlatform, link: &str, password: &str) -> OwnerSession {
        let (page, session) = Self::accept_page(p, link, password).await;
        assert_eq!(page.status, StatusCode::SEE_OTHER, "{}", page.body);
        let session = session.expect("a session");
        let mut o =
            OwnerSession { client: client(p), base: p.url().to_owned(), session, csrf: String::new() };
        let account = o.get("/dashboard/account").await;
        assert_eq!(account.status, StatusCode::OK, "{}", account.body);
        o.csrf = form_key(&account.body).expect("the session's form key");
        o
    }

    /// Opens the invitation link and sets `password`: the answer, and the session cookie it
    /// set, if any.
    pub async fn accept_page(p: &TestPlatform, link: &str, password: &str) -> (Page, Option<String>) {
        let c = client(p);
        let form = c.get(link).send().await.expect("open the invitation");
        assert_eq!(form.status(), StatusCode::OK, "the invitation form");
        let key = set_cookie(&form, LOGIN_COOKIE).expect("the form's cookie");
        let body = form.text().await.unwrap();
        assert!(body.contains("id=\"invite\""), "{body}");
        let r = c
            .post(link)
            .header("cookie", format!("{LOGIN_COOKIE}={key}"))
            .form(&[("csrf", key.as_str()), ("password", password), ("again", password)])
            .send()
            .await
            .expect("set the password");
        let session = set_cookie(&r, SESSION_COOKIE).filter(|s| !s.is_empty());
        (Page::of(r).await, session)
    }

    /// Signs in with the owner's form (e-mail, password, code); `None` when refused.
    pub async fn sign_in(
        p: &TestPlatform,
        email: &str,
        password: &str,
        code: &str,
    ) -> (Page, Option<OwnerSession>) {
        let c = client(p);
        let form = c.get(format!("{}/dashboard/login", p.url())).send().await.expect("the sign-in form");
        let key = set_cookie(&form, LOGIN_COOKIE).expect("the form's cookie");
        let r = c
            .post(format!("{}/dashboard/login", p.url()))
            .header("cookie", format!("{LOGIN_COOKIE}={key}"))
            .form(&[("csrf", key.as_str()), ("email", email), ("password", password), ("code", code)])
            .send()
            .await
            .expect("sign in");
        let session = set_cookie(&r, SESSION_COOKIE).filter(|s| !s.is_empty());
        let page = Page::of(r).await;
        let Some(session) = session else { return (page, None) };
        let mut o = OwnerSession { client: c, base: p.url().to_owned(), session, csrf: String::new() };
        let account = o.get("/dashboard/account").await;
        o.csrf = form_key(&account.body).unwrap_or_default();
        (page, Some(o))
    }

    pub async fn get(&self, path: &str) -> Page {
        let r = self
            .client
            .get(format!("{}{path}", self.base))
            .header("cookie", format!("{SESSION_COOKIE}={}", self.session))
            .send()
            .await
            .expect("GET");
        Page::of(r).await
    }

    /// POSTs a form with the session's key added.
    pub async fn post(&self, path: &str, fields: &[(&str, &str)]) -> Page {
        let mut f: Vec<(&str, &str)> = vec![("csrf", self.csrf.as_str())];
        f.extend_from_slice(fields);
        let r = self
            .client
            .post(format!("{}{path}", self.base))
            .header("cookie", format!("{SESSION_COOKIE}={}", self.session))
            .form(&f)
            .send()
            .await
            .expect("POST");
        Page::of(r).await
    }

    /// Creates an API key on the account page; returns it (shown once).
    pub async fn create_api_key(&self, label: &str) -> String {
        let page = self.post("/dashboard/account/keys", &[("label", label)]).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let key = page.body.split("gpumk_").nth(1).expect("the key on the page");
        format!("gpumk_{}", &key[..64])
    }
}

/// The text inside the element with `id` on a page (up to the next tag), if there is one.
pub fn text_of(page: &str, id: &str) -> Option<String> {
    let rest = page.split(&format!("id=\"{id}\"")).nth(1)?;
    let rest = &rest[rest.find('>')? + 1..];
    Some(rest[..rest.find('<')?].to_owned())
}

impl Page {
    pub async fn of(r: reqwest::Response) -> Page {
        let status = r.status();
        let location = r.headers().get("location").map(|v| v.to_str().unwrap_or_default().to_owned());
        Page { status, location, body: r.text().await.unwrap_or_default() }
    }
}

//! Every text of the dashboard: one table, Russian and English side by side. The Russian follows
//! the owner's guide (the seed): «личный кабинет», «код подключения», «Удалить», «Оборудование
//! проверено», «Ожидает проверки». It is a [`gpum_common::texts!`] table, as the agent's and
//! the installer's are; `{name}` placeholders are filled by the caller with [`fill`], and the
//! result is escaped by the template like any other text.
//!
//! The language comes from the `__Host-gpum_lang` cookie (set by the switch), else from
//! `Accept-Language`, else English.

use gpum_common::Lang;
pub use gpum_common::texts::fill;
use gpum_protocol::{NvmlState, ProbeFailure, VerificationState};

gpum_common::texts! {
    /// A text of the dashboard.
    pub enum Msg {
        Title => ("Личный кабинет gpum", "gpum dashboard"),
        Disabled => (
            "Личный кабинет выключен: запустите платформу с --admin-token-file.",
            "The dashboard is disabled: start the platform with --admin-token-file.",
        ),
        SignInTitle => ("Вход в личный кабинет", "Sign in to the dashboard"),
        SignInHelp => (
            "Вставьте токен администратора: содержимое файла --admin-token-file.",
            "Paste the admin token: the content of the --admin-token-file file.",
        ),
        AdminToken => ("Токен администратора", "Admin token"),
        SignIn => ("Войти", "Sign in"),
        SignOut => ("Выйти", "Sign out"),
        WrongToken => ("Неверный токен администратора.", "Wrong admin token."),
        TooManyAttempts => (
            "Слишком много неверных токенов с вашего адреса. Повторите через {n} с.",
            "Too many wrong tokens from your address. Try again in {n} s.",
        ),
        // Owners' accounts.
        // Alerts to owners (issue 46): the e-mails' subjects and body, and the account page's section.
        AlertOfflineOpened => ("сервер {name} не на связи", "server {name} is offline"),
        AlertOfflineClosed => ("сервер {name} снова на связи", "server {name} is back online"),
        AlertCheckOpened => ("сервер {name} не прошёл проверку видеокарты", "server {name} failed its GPU check"),
        AlertCheckClosed => ("сервер {name} прошёл проверку видеокарты", "server {name} passed its GPU check"),
        AlertQuarantineOpened => ("сервер {name} на карантине", "server {name} is quarantined"),
        AlertQuarantineClosed => ("сервер {name} снят с карантина", "server {name} is out of quarantine"),
        AlertEmailBody => (
            "gpum: {what}.\n\nСервер: {name} ({id})\nКогда: {at}\nСтраница сервера: {url}\n\n\
             Оповещения настраиваются в личном кабинете: {settings}\n",
            "gpum: {what}.\n\nServer: {name} ({id})\nWhen: {at}\nThe server's page: {url}\n\n\
             Alerts are set in your dashboard: {settings}\n",
        ),
        AlertsTitle => ("Оповещения", "Alerts"),
        AlertsHelp => (
            "Платформа сообщит вам по электронной почте и вебхуком, когда сервер долго не на связи, не прошёл \
             проверку видеокарты или попал на карантин, и ещё раз, когда это закончится.",
            "The platform tells you by e-mail and by webhook when a server stays offline, fails its GPU check \
             or is quarantined, and once more when that ends.",
        ),
        AlertEmail => ("Электронная почта для оповещений", "E-mail for alerts"),
        AlertWebhook => ("Адрес вебхука", "Webhook URL"),
        AlertOfflineMinutes => (
            "Сообщать, если сервер не на связи дольше стольких минут",
            "Tell me when a server is offline for longer than this many minutes",
        ),
        AlertKindsLegend => ("О чём сообщать", "What to tell me about"),
        AlertKindOffline => ("сервер не на связи", "server offline"),
        AlertKindCheck => ("проверка видеокарты не пройдена", "GPU check failed"),
        AlertKindQuarantine => ("сервер на карантине", "server quarantined"),
        AlertSave => ("Сохранить оповещения", "Save the alerts"),
        AlertNoEmail => (
            "Оператор платформы не настроил отправку почты: письма не отправляются.",
            "The platform's operator has not set up e-mail: no e-mail is sent.",
        ),
        AlertNoWebhook => (
            "Оператор платформы не настроил ключ подписи: вебхуки не отправляются.",
            "The platform's operator has not set up a signing key: no webhook is sent.",
        ),
        AlertKeyHelp => (
            "Каждый вебхук подписан ключом платформы (заголовок {header}); проверьте подпись открытым ключом:",
            "Every webhook is signed with the platform's key (the {header} header); check it with the public key:",
        ),
        AlertSentTitle => ("Последние оповещения", "Recent alerts"),
        AlertNoneSent => ("Оповещений ещё не было.", "No alert sent yet."),
        AlertColTime => ("Время", "Time"),
        AlertColServer => ("Сервер", "Server"),
        AlertColKind => ("Событие", "Event"),
        AlertColState => ("Состояние", "State"),
        AlertColChannel => ("Канал", "Channel"),
        AlertColDelivery => ("Доставка", "Delivery"),
        AlertStateOpened => ("началось", "started"),
        AlertStateClosed => ("закончилось", "ended"),
        AlertChannelEmail => ("почта", "e-mail"),
        AlertChannelWebhook => ("вебхук", "webhook"),
        AlertDelivered => ("доставлено", "delivered"),
        AlertFailed => ("не доставлено", "not delivered"),
        AlertPending => ("отправляется", "sending"),
        AlertErrEmail => ("Это не адрес электронной почты.", "This is not an e-mail address."),
        AlertErrUrl => ("Это не адрес вебхука.", "This is not a webhook URL."),
        AlertErrHttps => ("Адрес вебхука должен начинаться с {https}.", "The webhook URL must start with {https}."),
        AlertErrPrivate => (
            "Адрес в локальной или частной сети не принимается.",
            "An address on a loopback, private or link-local network is not accepted.",
        ),
        AlertErrMinutes => ("Целое число минут от 1 до {n}.", "A whole number of minutes from 1 to {n}."),
        OperatorSignInTitle => ("Вход оператора платформы", "The platform operator's sign-in"),
        NavAccount => ("Учётная запись", "Account"),
        NavOperator => ("оператор", "operator"),
        ColOwner => ("Владелец", "Owner"),
        OperatorsOwn => ("сервер оператора", "the operator's own"),
        Email => ("Электронная почта", "E-mail"),
        Password => ("Пароль", "Password"),
        PasswordAgain => ("Пароль ещё раз", "The password again"),
        TotpCodeOptional => (
            "Код из приложения-аутентификатора или код восстановления (если вы включили второй фактор)",
            "Code from the authenticator app, or a recovery code (if you turned on the second factor)",
        ),
        PasswordSetSignIn => (
            "Пароль задан. Войдите с новым паролем и кодом из приложения-аутентификатора (или кодом восстановления).",
            "Your password is set. Sign in with the new password and a code from your authenticator app (or a recovery code).",
        ),
        OwnerSignInHelp => (
            "Войдите с адресом электронной почты и паролем, заданным по ссылке-приглашению.",
            "Sign in with your e-mail and the password you set from your invitation link.",
        ),
        WrongPassword => (
            "Неверный адрес, пароль или код. Забыли пароль? Попросите оператора прислать новое приглашение.",
            "Wrong e-mail, password or code. Forgot your password? Ask the operator for a new invitation.",
        ),
        TooManySignIns => (
            "Слишком много неудачных попыток входа с вашего адреса. Повторите через {n} с.",
            "Too many failed sign-ins from your address. Try again in {n} s.",
        ),
        InviteTitle => ("Приглашение в gpum", "Your gpum invitation"),
        InviteHelp => (
            "Задайте пароль для {email}: не короче {n} символов. Затем вы войдёте в личный кабинет.",
            "Set a password for {email}: at least {n} characters. You are then signed in.",
        ),
        InviteGone => (
            "Ссылка-приглашение недействительна: она уже использована, истекла или заменена новой. \
             Попросите оператора прислать новую.",
            "This invitation link no longer works: it was used, it expired, or a newer one replaced it. \
             Ask the operator for a new one.",
        ),
        SetPassword => ("Задать пароль и войти", "Set the password and sign in"),
        PasswordShort => ("Пароль должен быть не короче {n} символов.", "The password must be at least {n} characters."),
        PasswordLong => ("Пароль слишком длинный.", "The password is too long."),
        PasswordMismatch => ("Пароли не совпадают.", "The two passwords differ."),
        AccountTitle => ("Учётная запись", "Your account"),
        SignedInAs => ("Вы вошли как {email}.", "You are signed in as {email}."),
        TotpTitle => ("Второй фактор (TOTP)", "Second factor (TOTP)"),
        TotpOn => (
            "Включён: при входе нужен код из приложения-аутентификатора.",
            "On: signing in needs a code from your authenticator app.",
        ),
        TotpOff => (
            "Выключен. Включите, чтобы для входа, кроме пароля, нужен был код из приложения-аутентификатора.",
            "Off. Turn it on so that signing in needs a code from your authenticator app besides the password.",
        ),
        TotpTurnOn => ("Включить второй фактор", "Turn on the second factor"),
        TotpTurnOff => ("Выключить второй фактор", "Turn off the second factor"),
        TotpSetupHelp => (
            "Добавьте этот ключ в приложение-аутентификатор (вручную или по ссылке), затем введите код, который оно покажет.",
            "Add this key to your authenticator app (by hand or with the link), then enter the code it shows.",
        ),
        TotpKey => ("Ключ", "Key"),
        TotpLink => ("Ссылка для приложения", "Link for the app"),
        TotpQr => (
            "Отсканируйте этот код приложением-аутентификатором",
            "Scan this code with your authenticator app",
        ),
        TotpCode => ("Код из приложения", "Code from the app"),
        TotpConfirm => ("Подтвердить и включить", "Confirm and turn on"),
        TotpWrong => (
            "Код не подошёл (неверный или уже использован). Проверьте время на телефоне и введите новый код.",
            "The code did not match (wrong, or already used). Check the phone's clock and enter a new code.",
        ),
        CurrentPassword => ("Текущий пароль", "Current password"),
        CodeOrRecovery => (
            "Код из приложения или код восстановления",
            "Code from the app, or a recovery code",
        ),
        TotpChangesNeed => (
            "Сменить ключ, получить новые коды восстановления или выключить второй фактор можно только с текущим паролем и кодом.",
            "Changing the key, getting new recovery codes and turning the second factor off each need your current password and a code.",
        ),
        TotpChangeKey => ("Сменить ключ", "Change the key"),
        RecoveryNewSet => ("Новые коды восстановления", "New recovery codes"),
        RecoveryTitle => ("Коды восстановления", "Recovery codes"),
        RecoveryHelp => (
            "Сохраните эти коды в надёжном месте: платформа хранит только их хеши и больше их не покажет. \
             Если телефон с приложением потерян, войдите с паролем и одним из кодов вместо кода из приложения; \
             каждый код работает один раз. Новый набор заменяет этот.",
            "Keep these codes somewhere safe: the platform keeps only their hashes and will not show them again. \
             If you lose the phone with the app, sign in with your password and one of these codes in place of the \
             app's code; each code works once. A new set replaces this one.",
        ),
        CredentialsWrong => (
            "Неверный пароль или код. Ничего не изменено.",
            "Wrong password or code. Nothing was changed.",
        ),
        TotpNotStarted => (
            "Новый ключ не выдан или устарел. Начните заново: введите пароль.",
            "No new key was given, or it is out of date. Start again with your password.",
        ),
        TooManyAccountChecks => (
            "Слишком много неверных паролей или кодов с вашего адреса. Повторите через {n} с.",
            "Too many wrong passwords or codes from your address. Try again in {n} s.",
        ),
        TotpResetByOperator => (
            "Оператор платформы выключил ваш второй фактор {at} и завершил все сеансы и ключи API. \
             Включите второй фактор снова. Если вы об этом не просили, свяжитесь с оператором.",
            "The platform's operator turned off your second factor on {at} and ended every session and API key. \
             Turn the second factor on again. If you did not ask for this, contact the operator.",
        ),
        ApiKeysTitle => ("Ключи API", "API keys"),
        ApiKeysHelp => (
            "Ключ API даёт вашим программам те же действия с вашими серверами, что и эта страница, и \
             только с ними. Ключ показывается один раз; программа передаёт его в заголовке запроса:",
            "An API key lets your programs do what this page does with your servers, and only with \
             them. A key is shown once; a program sends it in a request's header:",
        ),
        NoApiKeys => ("Ключей нет.", "No keys."),
        KeyLabel => ("Название ключа", "Key label"),
        CreateKey => ("Создать ключ", "Create a key"),
        Revoke => ("Отозвать", "Revoke"),
        KeyCreatedTitle => ("Ключ API создан", "API key created"),
        KeyCreatedHelp => (
            "Скопируйте ключ сейчас: платформа хранит только его хеш и больше его не покажет.",
            "Copy the key now: the platform keeps only its hash and will not show it again.",
        ),
        KeyLabelBad => ("Название ключа: от 1 до {n} символов.", "A key's label: 1 to {n} characters."),
        TooManyKeys => ("Не больше {n} ключей: сначала отзовите ненужный.", "At most {n} keys: revoke one first."),
        ColKeyLabel => ("Название", "Label"),
        ColLastUsed => ("Последнее использование", "Last used"),
        NeverUsed => ("не использовался", "never"),
        ToAccount => ("К учётной записи", "Back to the account"),
        StaleForm => ("Форма устарела", "This form is out of date"),
        StaleFormHelp => (
            "Запрос отклонён: в нём нет действующего ключа формы. Откройте страницу заново и повторите.",
            "The request was refused: it carries no valid form key. Open the page again and retry.",
        ),
        Back => ("Назад", "Back"),
        OpenCodesLimit => ("Слишком много кодов подключения", "Too many join codes"),
        OpenCodesLimitHelp => (
            "У вас {n} неиспользованных кодов подключения — больше платформа не выдаёт. Используйте один из них или дождитесь, пока истечёт срок; если нужно больше, напишите оператору платформы.",
            "You have {n} unused join codes, the most the platform gives out. Use one of them or let one expire; if you need more, ask the platform's operator.",
        ),
        NavServers => ("Серверы", "Servers"),
        NavAdd => ("Добавить машину", "Add a machine"),
        // Issue 46: earnings.
        NavEarnings => ("Заработок", "Earnings"),
        EarningsTitle => ("Заработок", "Earnings"),
        EarningsHelp => (
            "Аренда оплачивается только за время, когда агент сообщал, что она работает: посекундно,              за каждую видеокарту, по цене сервера на момент создания аренды. Пока сервер не на связи,              время не идёт. Суммы в {currency}, дни и месяцы по UTC.",
            "A rental earns only while its agent reports it running: by the second, per GPU, at the              server's price when the rental was created. While the server is offline, no time counts.              Amounts in {currency}; days and months in UTC.",
        ),
        EarningsTotal => (
            "Всего: {amount}; часов работы видеокарт: {hours}; аренд: {n}.",
            "Total: {amount}; GPU-hours: {hours}; rentals: {n}.",
        ),
        EarningsCsv => ("Скачать CSV", "Download CSV"),
        EarningsNone => ("На ваших серверах ещё не было аренд.", "No rental has run on your servers yet."),
        EarningsByServer => ("По серверам", "Per server"),
        EarningsByMonth => ("По месяцам", "Per month"),
        EarningsByDay => ("По дням", "Per day"),
        EarningsByRental => ("По арендам", "Per rental"),
        EarningsServer => ("Сервер", "Server"),
        EarningsMonth => ("Месяц", "Month"),
        EarningsDay => ("День", "Day"),
        EarningsRental => ("Аренда", "Rental"),
        EarningsRentals => ("Аренд", "Rentals"),
        EarningsState => ("Состояние", "State"),
        EarningsGpus => ("Видеокарт", "GPUs"),
        EarningsGpuHours => ("Часы работы видеокарт", "GPU-hours"),
        EarningsPrice => ("Цена за час работы видеокарты", "Price per GPU-hour"),
        EarningsAmount => ("Сумма", "Amount"),
        LangSwitch => ("English", "Русский"),
        ServersTitle => ("Серверы", "Servers"),
        NoServers => (
            "Серверов пока нет. Добавьте машину: создайте код подключения и запустите установщик.",
            "No servers yet. Add a machine: create a join code and run the installer.",
        ),
        NextPage => ("Следующие серверы →", "Next servers →"),
        FirstPage => ("← К началу списка", "← Back to the start"),
        ColServer => ("Сервер", "Server"),
        ColState => ("Состояние", "State"),
        ColVerification => ("Проверка", "Check"),
        ColGpus => ("Видеокарты", "GPUs"),
        ColAgent => ("Версия агента", "Agent version"),
        ColLastSeen => ("Последняя связь", "Last seen"),
        Online => ("онлайн", "online"),
        Offline => ("офлайн", "offline"),
        NeverSeen => ("ещё не выходил на связь", "not seen yet"),
        SecondsAgo => ("{n} с назад", "{n} s ago"),
        MinutesAgo => ("{n} мин назад", "{n} min ago"),
        HoursAgo => ("{n} ч назад", "{n} h ago"),
        DaysAgo => ("{n} дн. назад", "{n} d ago"),
        Verified => ("Оборудование проверено", "Hardware verified"),
        AwaitingCheck => ("Ожидает проверки", "Awaiting check"),
        CheckFailed => ("Проверка не пройдена", "Check failed"),
        TenantsSee => ("видят арендаторы", "tenants see"),
        OnlyYouSee => ("видите только вы", "only you see"),
        LegendTenants => (
            "Арендаторам показываются только характеристики объявления (модель карты, видеопамять, \
             процессор, ОЗУ, диск), состояние «онлайн/офлайн», результат проверки, цена и \
             минимальное время аренды. Приостановленный вами сервер им не предлагается.",
            "Tenants see only the listing (GPU model, video memory, CPU, RAM, disk), the \
             online/offline state, the check's result, the price and the minimum rental time. A \
             server you paused is not offered to them.",
        ),
        LegendOwner => (
            "Название сервера, имя компьютера, UUID видеокарт и версии программ видите только вы.",
            "The server's name, the host name, the GPU UUIDs and the software versions are seen \
             only by you.",
        ),
        AddTitle => ("Добавить машину", "Add a machine"),
        AddHelp => (
            "Создайте код подключения: он одноразовый и действует ограниченное время. Команду \
             установки с кодом запустите на машине с видеокартой.",
            "Create a join code: it works once and for a limited time. Run the install command \
             with the code on the machine with the GPU.",
        ),
        Lifetime => ("Срок действия кода", "The code's lifetime"),
        Ttl1h => ("1 час", "1 hour"),
        Ttl24h => ("24 часа", "24 hours"),
        Ttl7d => ("7 дней", "7 days"),
        CreateCode => ("Создать код подключения", "Create a join code"),
        CodeCreated => ("Код подключения", "Join code"),
        CodeExpires => ("действует до {at}", "valid until {at}"),
        InstallCommand => ("Команда установки", "Install command"),
        InstallHelp => (
            "Запустите на машине. Нужны права суперпользователя (root): установщик запускается через sudo.",
            "Run it on the machine. It needs root: the installer runs through sudo.",
        ),
        DryRunCommand => ("Только проверка (--dry-run)", "Check only (--dry-run)"),
        DryRunHelp => (
            "Перед первым запуском можно добавить к команде --dry-run: установщик только проверит \
             машину и ничего не изменит.",
            "Before the first run you can add --dry-run: the installer only checks the machine \
             and changes nothing.",
        ),
        NoexecCommand => ("Если /tmp запрещает запуск (noexec)", "If /tmp forbids running programs (noexec)"),
        NoexecHelp => (
            "Если /tmp запрещает запуск, замените в команде sudo bash на sudo env TMPDIR=/var/tmp bash.",
            "If /tmp forbids running programs, replace sudo bash in the command with \
             sudo env TMPDIR=/var/tmp bash.",
        ),
        NoDist => (
            "Команды установки здесь нет: платформа не раздаёт установщик и агент. Оператору \
             платформы: запустите её с --dist КАТАЛОГ, где лежат файлы выпуска (docs/operator-guide.md).",
            "No install command here: the platform does not serve the installer and the agent. \
             For the platform's operator: start it with --dist DIR holding the release's files \
             (docs/operator-guide.md, \"Serving releases\").",
        ),
        DistIncomplete => (
            "Команды установки здесь нет: в каталоге --dist платформы не хватает файлов выпуска: \
             {files}. Оператору платформы: положите их туда (docs/operator-guide.md).",
            "No install command here: the platform's --dist directory lacks release files: \
             {files}. For the platform's operator: put them there (docs/operator-guide.md, \
             \"Serving releases\").",
        ),
        Copy => ("Копировать", "Copy"),
        Copied => ("Скопировано", "Copied"),
        WaitingMachine => (
            "Ждём машину: запустите на ней команду установки.",
            "Waiting for the machine: run the install command on it.",
        ),
        CodeExpired => ("Код подключения истёк. Создайте новый код.", "The join code has expired. Create a new code."),
        MachineRegistered => (
            "Машина зарегистрирована; ждём, когда агент впервые выйдет на связь.",
            "The machine registered; waiting for the agent's first heartbeat.",
        ),
        MachineOnline => ("Сервер {node} онлайн.", "Server {node} is online."),
        ServerDeleted => ("Этот сервер удалён.", "This server was deleted."),
        OpenServer => ("Открыть страницу сервера", "Open the server's page"),
        ServerTitle => ("Сервер {node}", "Server {node}"),
        Inventory => ("Оборудование", "Hardware"),
        GpuModel => ("Модель видеокарты", "GPU model"),
        GpuCount => ("Число видеокарт", "GPU count"),
        GpuMemory => ("Видеопамять", "Video memory"),
        Cpu => ("Процессор", "CPU"),
        Ram => ("ОЗУ", "RAM"),
        Disk => ("Диск для Docker", "Disk for Docker"),
        RentalDiskLimit => ("Предел диска аренды", "A rental's disk limit"),
        DiskLimitOn => ("есть: XFS с квотами проектов", "enforced: XFS with project quotas"),
        DiskLimitOff => (
            "нет: диск аренды ограничен только свободным местом (нужна XFS с квотами проектов)",
            "not enforced: a rental's disk is bounded only by the free space (needs XFS with project quotas)"
        ),
        DiskLimitUnknown => ("неизвестно: агент не сообщил", "unknown: the agent did not say"),
        Hostname => ("Имя компьютера", "Host name"),
        GpuUuids => ("UUID видеокарт", "GPU UUIDs"),
        Os => ("Операционная система", "OS"),
        Kernel => ("Ядро", "Kernel"),
        Driver => ("Драйвер NVIDIA", "NVIDIA driver"),
        Cuda => ("CUDA", "CUDA"),
        Docker => ("Docker", "Docker"),
        Toolkit => ("NVIDIA Container Toolkit", "NVIDIA Container Toolkit"),
        AgentVersion => ("Версия агента", "Agent version"),
        Registered => ("Зарегистрирован", "Registered"),
        LastProbe => ("Последняя проверка", "Last check"),
        ProbeOutput => ("Вывод проверки", "The check's output"),
        NoProbeYet => ("Проверка ещё не запускалась.", "No check has run yet."),
        Commands => ("Команды", "Commands"),
        Recheck => ("Повторить проверку", "Check again"),
        Restart => ("Перезапустить агент", "Restart the agent"),
        CommandQueued => ("ждёт, когда агент выйдет на связь", "waiting for the agent"),
        CommandDelivered => ("передана агенту", "handed to the agent"),
        CommandOk => ("выполнена", "done"),
        CommandFailed => ("не выполнена", "failed"),
        NoCommands => ("Команд ещё не было.", "No commands yet."),
        CommandsOffline => (
            "Сервер офлайн: команды доходят до него, только когда он онлайн.",
            "The server is offline: commands reach it only when it is online.",
        ),
        CommandRefused => ("Команда не отправлена", "The command was not sent"),
        RotateToken => ("Заменить токен", "Replace the token"),
        RotateTitle => ("Заменить токен сервера {node}?", "Replace the token of server {node}?"),
        RotateExplain => (
            "Платформа выдаст новый токен и покажет его один раз. Прежний токен перестанет \
             действовать: агент при следующем обращении получит отказ, остановится и не будет \
             перезапускаться сам, пока вы не передадите ему новый токен на машине.",
            "The platform issues a new token and shows it once. The old token stops working: at \
             its next heartbeat the agent is refused, stops, and stays stopped until you give it \
             the new token on the machine.",
        ),
        RotateConfirm => ("Заменить токен", "Replace the token"),
        RotatedTitle => ("Новый токен сервера {node}", "The new token of server {node}"),
        RotatedOnce => (
            "Токен показан один раз: платформа хранит только его хеш. Не сохраняйте его нигде, \
             кроме машины.",
            "The token is shown once: the platform keeps only its hash. Keep it nowhere but on \
             the machine.",
        ),
        RotatedSteps => (
            "На машине выполните первую команду, вставьте токен, нажмите Enter и Ctrl-D; затем \
             запустите службу второй командой. Первая команда меняет в настройках агента только \
             адрес платформы, номер сервера и токен: остальные (свой центр сертификации, сокет \
             Docker, реестры, отключённая аренда) остаются. Установщик для этого не нужен.",
            "On the machine, run the first command, paste the token, press Enter and Ctrl-D; \
             then start the service with the second command. The first command changes only the \
             platform's address, the server's id and the token in the agent's settings: the others \
             (a private CA, the Docker socket, the registries, rentals turned off) stay. The installer \
             is not needed for this.",
        ),
        Delete => ("Удалить", "Delete"),
        DeleteTitle => ("Удалить сервер {node}?", "Delete server {node}?"),
        DeleteWhatNext => ("Что будет дальше:", "What happens next:"),
        DeleteAgentStops => (
            "Агент при следующем обращении получит отказ, остановится и не будет перезапускаться сам.",
            "At its next heartbeat the agent is refused, stops, and does not start again by itself.",
        ),
        DeleteFilesStay => (
            "Файлы при этом остаются на машине до команды удаления: \
             sudo /opt/gpum-agent/gpum-agent uninstall --yes. Контейнеры не удаляются.",
            "Its files stay on the machine until the uninstall command: \
             sudo /opt/gpum-agent/gpum-agent uninstall --yes. No container is removed.",
        ),
        DeleteNewServer => (
            "Чтобы подключить машину снова, создайте новый код подключения и запустите установщик: \
             будет создан новый сервер.",
            "To connect the machine again, create a new join code and run the installer: a new \
             server is created.",
        ),
        DeleteConfirm => ("Удалить сервер", "Delete the server"),
        Cancel => ("Отмена", "Cancel"),
        ColPrice => ("Цена", "Price"),
        NodeId => ("Идентификатор", "Id"),
        PricePerGpuHour => ("{price} за час работы видеокарты", "{price} per GPU-hour"),
        NotForRent => ("пока не сдаётся", "not for rent yet"),
        PausedByYou => ("приостановлен вами", "paused by you"),
        MinRentalValue => ("аренда от {n} мин", "rented for {n} min at least"),
        SettingsTitle => ("Название и цена", "Name and price"),
        ServerName => ("Название сервера", "Server name"),
        ServerNameHelp => (
            "До 64 символов. Если оставить поле пустым, названием будет имя компьютера.",
            "Up to 64 characters. Empty: the host name.",
        ),
        PriceLabel => ("Цена за час работы одной видеокарты", "Price per GPU-hour"),
        PriceHelp => (
            "В валюте платформы ({currency}), например {example}. Пустое поле — сервер пока не сдаётся.",
            "In the platform's currency ({currency}), e.g. {example}. Empty: not for rent yet.",
        ),
        MinRentalLabel => ("Минимальное время аренды, минут", "Minimum rental time, minutes"),
        Save => ("Сохранить", "Save"),
        Pause => ("Приостановить сдачу", "Pause"),
        Resume => ("Возобновить сдачу", "Resume"),
        PauseHelp => (
            "Приостановленный сервер не предлагается арендаторам; цена и название сохраняются.",
            "A paused server is not offered to tenants; its price and name are kept.",
        ),
        // Agent upgrades (issue 47): the server page's section and its switch.
        UpgradesTitle => ("Обновления агента", "Agent upgrades"),
        AutoUpdateOn => ("Автоматические обновления: включены", "Automatic upgrades: on"),
        AutoUpdateOff => ("Автоматические обновления: выключены", "Automatic upgrades: off"),
        AutoUpdateTurnOff => ("Выключить автоматические обновления", "Turn automatic upgrades off"),
        AutoUpdateTurnOn => ("Включить автоматические обновления", "Turn automatic upgrades on"),
        AutoUpdateHelp => (
            "Платформа предлагает агенту новую версию; агент сам проверяет её подпись и что она новее, \
             а если новая версия не выходит на связь, возвращает прежнюю. Аренды при этом продолжаются. \
             Выключено — агент остаётся на своей версии; переустановка, как прежде, тоже возможна.",
            "The platform offers the agent a new version; the agent itself checks its signature and that \
             it is newer, and puts the previous one back if the new one does not get in touch. Rentals \
             keep running. Off: the agent stays on its version; reinstalling still works as before.",
        ),
        AutoUpdateAgentOff => (
            "В настройках агента на самом сервере автоматические обновления выключены.",
            "The agent's config.toml turns automatic upgrades off (auto_update = false).",
        ),
        UpgradePending => ("Ожидается обновление до {version}", "Upgrade to {version} pending"),
        NoUpgradePending => ("Обновление не ожидается", "No upgrade pending"),
        LastUpgrade => ("Последнее обновление", "Last upgrade"),
        NoUpgradeYet => ("Ещё не обновлялся", "Not upgraded yet"),
        UpgradeSucceeded => ("{from} → {to}: успешно", "{from} → {to}: succeeded"),
        UpgradeRolledBack => (
            "{from} → {to}: новая версия не вышла на связь, возвращена прежняя",
            "{from} → {to}: the new version did not get in touch; the previous one was put back",
        ),
        UpgradeRefused => (
            "{from} → {to}: агент отказался (проверка не пройдена), ничего не изменено",
            "{from} → {to}: refused by the agent (verification failed); nothing changed",
        ),
        UpgradeFailed => (
            "{from} → {to}: не удалось загрузить, ничего не изменено; будет повторено",
            "{from} → {to}: the download failed; nothing changed; it will be retried",
        ),
        RolloutHalted => (
            "Выпуск {version} остановлен: {failed} из {reported} серверов не смогли обновиться.",
            "The rollout of {version} is halted: {failed} of {reported} servers failed to upgrade.",
        ),
        RolloutHaltedByOperator => (
            "Выпуск {version} остановлен оператором.",
            "The rollout of {version} was halted by the operator.",
        ),
        ErrNameLength => ("Название: от 1 до 64 символов.", "The name must be 1 to 64 characters."),
        ErrNameControl => (
            "В названии не должно быть управляющих символов (перевода строки, табуляции).",
            "The name must not contain control characters (line breaks, tabs).",
        ),
        ErrPrice => (
            "Цена в {currency} — число больше нуля, не больше {max}, например {example}.",
            "The price in {currency} must be a number above zero, at most {max}, such as {example}.",
        ),
        // Issue 46: scheduled maintenance on a server's page.
        MaintenanceTitle => ("Обслуживание", "Maintenance"),
        MaintenanceHelp => (
            "На время обслуживания сервер не сдаётся. Платформа не размещает аренду, которая \
             задела бы окно обслуживания: новая аренда должна закончиться до его начала. \
             Аренды, размещённые раньше, доработают до своего конца. Начало и конец вводятся \
             в UTC, а в таблице показаны в часовом поясе вашего браузера. Чтобы снять сервер \
             с аренды сразу, приостановите сдачу.",
            "During maintenance the server is not rentable: the platform places no rental that \
             would overlap the window, so a new rental must end before it starts. Rentals placed \
             before it run to their end. Enter the start and end in UTC; the table shows them in \
             your browser's time zone. To take the server off rent at once, pause it.",
        ),
        NoMaintenance => ("Обслуживание не запланировано.", "No maintenance planned."),
        ColMaintStart => ("Начало", "Start"),
        ColMaintEnd => ("Конец", "End"),
        MaintNow => ("идёт сейчас", "in progress"),
        MaintStartLabel => ("Начало обслуживания, UTC", "Maintenance start, UTC"),
        MaintEndLabel => ("Конец обслуживания, UTC", "Maintenance end, UTC"),
        MaintAdd => ("Запланировать обслуживание", "Plan maintenance"),
        MaintDelete => ("Удалить окно", "Delete window"),
        ErrMaintTime => (
            "Укажите дату и время в виде ГГГГ-ММ-ДД ЧЧ:ММ (UTC).",
            "Enter a date and time as YYYY-MM-DD HH:MM (UTC).",
        ),
        ErrMaintOrder => ("Конец должен быть позже начала.", "The end must be after the start."),
        ErrMaintPast => ("Конец уже прошёл: укажите время в будущем.", "The end has passed: enter a time in the future."),
        ErrMaintAhead => (
            "Конец — не дальше чем через {days} дней.",
            "The end must be at most {days} days away.",
        ),
        ErrMaintTooMany => (
            "У сервера уже {n} окон обслуживания — это предел. Удалите ненужное окно.",
            "The server already has {n} maintenance windows, the limit. Delete one you no longer need.",
        ),
        ErrMinRental => (
            "Минимальное время аренды — от 1 до 10080 минут (неделя).",
            "The minimum rental time must be 1 to 10080 minutes (a week).",
        ),
        Deleted => ("Сервер {node} удалён.", "Server {node} was deleted."),
        NotFound => ("Такого сервера нет.", "No such server."),
        NoSuchJoinCode => (
            "Такого кода подключения нет. Создайте новый код.",
            "No such join code. Create a new code.",
        ),
        // Issue 46: what is no page of the cabinet, and a form refused with why.
        NotFoundTitle => ("Не найдено", "Not found"),
        NoSuchPage => ("Такой страницы в личном кабинете нет.", "The dashboard has no such page."),
        BackToPage => ("Вернуться в личный кабинет", "Back to the dashboard"),
        NotAFormTitle => ("По этому адресу отправляют форму", "This address takes a form"),
        NotAFormHelp => (
            "Сюда приходит форма, а не открывается страница: так бывает, если обновить страницу \
             после отправки формы. Ничего не изменено.",
            "A form is sent here; it is not a page to open (a reload after sending a form leads \
             here). Nothing was changed.",
        ),
        TooLargeTitle => ("Форма слишком большая", "The form is too large"),
        TooLargeHelp => (
            "Форма больше {n} байт, и платформа её не приняла. Ничего не изменено.",
            "The form is over {n} bytes, and the platform did not take it. Nothing was changed.",
        ),
        TooSlowTitle => ("Форма не дошла вовремя", "The form took too long"),
        TooSlowHelp => (
            "Форма шла слишком долго, и платформа перестала её ждать. Ничего не изменено: \
             отправьте её ещё раз.",
            "The form took too long to arrive, and the platform stopped waiting. Nothing was \
             changed: send it again.",
        ),
        TooManyTitle => ("Слишком много запросов", "Too many requests"),
        TooManyHelp => ("Подождите немного и повторите.", "Wait a little and try again."),
        RefusedTitle => ("Запрос не принят", "The request was refused"),
        RefusedHelp => ("Платформа не приняла запрос. Ничего не изменено.", "The platform refused the request. Nothing was changed."),
        InternalTitle => ("Сбой платформы", "The platform failed"),
        InternalHelp => (
            "Платформа не смогла выполнить запрос. Повторите его; если сбой не проходит, сообщите \
             оператору платформы.",
            "The platform could not carry out the request. Try again; if it keeps failing, tell \
             the platform's operator.",
        ),
        BadFormTitle => ("Форма не принята", "The form was refused"),
        BadFormMissing => (
            "В форме нет поля «{field}». Ничего не изменено.",
            "The form lacks the field “{field}”. Nothing was changed.",
        ),
        BadFormValue => (
            "Поле «{field}» не может быть «{value}». Ничего не изменено.",
            "The field “{field}” cannot be “{value}”. Nothing was changed.",
        ),
        BadFormNotUtf8 => (
            "Поле «{field}» не в кодировке UTF-8, а платформа принимает только её. Ничего не изменено.",
            "The field “{field}” is not UTF-8, the only encoding the platform takes. Nothing was changed.",
        ),
        BadFormUnreadable => ("Форму не удалось прочитать. Ничего не изменено.", "The form could not be read. Nothing was changed."),
        UnknownCommand => (
            "Команды «{kind}» нет: сервер понимает только «Повторить проверку» и «Перезапустить \
             агент». Ничего не отправлено.",
            "There is no command “{kind}”: a server takes only “Check again” and “Restart the \
             agent”. Nothing was sent.",
        ),
        // The agent's own sentences (`web::agent_text`), with their values.
        AgNoProbeImage => (
            "образ для проверки не выбран: проверка ждёт, пока оператор платформы его выберет",
            "no check image is set: the check waits until the platform's operator chooses one",
        ),
        AgProbeDue => (
            "проверка уже назначена: она начнётся, как только позволит ограничение частоты",
            "a check is due already: it runs as soon as the rate limit allows",
        ),
        AgRestarting => ("перезапускается", "restarting"),
        AgProbeStarted => ("проверка запущена", "the check started"),
        AgUnknownCommand => ("агент не знает команды «{kind}» и не выполнил её", "the agent does not know the command “{kind}” and refused it"),
        AgRefusedQuarantined => ("отказано: сервер на карантине: {why}", "refused: the server is quarantined: {why}"),
        AgRefused => ("отказано: {why}", "refused: {why}"),
        AgLedgerUnreadable => (
            "агент не смог прочитать свой учёт видеокарт (gpus.json)",
            "the agent could not read its record of the GPUs (gpus.json)",
        ),
        AgAfterRental => (
            "проверка видеокарт после аренды {rental} не пройдена: {why}",
            "the GPU check after rental {rental} failed: {why}",
        ),
        AgSelfTest => (
            "самопроверка перед арендой {rental} не пройдена: {why}",
            "the self-test before rental {rental} failed: {why}",
        ),
        AgSelfTestProbe => (
            "самопроверка перед арендой {rental} не пройдена: проверка на {gpus} — {what}",
            "the self-test before rental {rental} failed: the check on {gpus}: {what}",
        ),
        AgGpuBusy => ("{gpu}: осталось процессов: {n} (номера {pids})", "{gpu}: {n} processes left (pid {pids})"),
        AgGpuNoAnswer => ("{gpu} не отвечает ({why})", "{gpu} does not answer ({why})"),
        QuarGpuNamed => ("видеокарта {i} ({model}, {uuid})", "GPU {i} ({model}, {uuid})"),
        QuarBusy => (
            "{gpu}: на ней остались процессы; завершите их (их показывает nvidia-smi) и запросите \
             повторную проверку",
            "{gpu}: processes were left on it; end them (nvidia-smi lists them), then ask for a recheck",
        ),
        QuarNoAnswer => (
            "{gpu} не отвечает: посмотрите её состояние в nvidia-smi; может понадобиться сброс \
             видеокарты или перезагрузка машины; затем запросите повторную проверку",
            "{gpu} does not answer: look at it with nvidia-smi; it may need a reset or \
             the machine a reboot; then ask for a recheck",
        ),
        QuarOther => (
            "{gpu}: когда она свободна и отвечает (nvidia-smi), запросите повторную проверку",
            "{gpu}: once it is free and answers (nvidia-smi), ask for a recheck",
        ),
        QuarNotHere => (
            "{gpu} — не из видеокарт этого сервера (её держал контейнер другой установки gpum в том \
             же Docker): здесь её проверка пройти не может; запросите повторную проверку — агент \
             снимет карантин, когда видеокарты этой машины свободны",
            "{gpu} is not one of this server's GPUs (a container of another gpum installation on the \
             same Docker held it): no check here can pass on it; ask for a recheck: the agent lifts \
             the quarantine once this machine's GPUs are free",
        ),
        AgCheckUnfinished => ("проверка видеокарт не завершилась ({why})", "the GPU check did not finish ({why})"),
        NoGpuCell => ("нет видеокарт", "no GPU"),
        ColReliability => ("Надёжность", "Reliability"),
        ColOccupancy => ("Занятость видеокарт", "GPUs in use"),
        OccRented => ("сдано: {n}", "rented: {n}"),
        OccIdle => ("свободно: {n}", "idle: {n}"),
        OccNotRentable => ("не сдаётся: {n}", "not rentable: {n}"),
        ColStart => ("Начало", "Start"),
        ReliabilityLast30 => ("{pct} % за последние 30 дней", "{pct}% over the last 30 days"),
        ReliabilitySince => ("{pct} % с подключения {at}", "{pct}% since it was connected on {at}"),
        ReliabilityNone => ("ещё не посчитана", "not computed yet"),
        ReliabilityHelp => (
            "Доля времени, когда сервер был онлайн и его видеокарты были в порядке (проверка не \
             провалена, нет карантина). Пауза и цена не в счёт. Это число видят арендаторы.",
            "The share of the time the server was online with its GPUs in order (its check not \
             failed, not quarantined). A pause and the price do not count. Tenants see this figure.",
        ),
        ErrNameBidi => (
            "В названии не должно быть символов, меняющих направление текста (U+202E и подобных).",
            "The name must not contain characters that change the text's direction (U+202E and the like).",
        ),
        // Rentable, or exactly why not ([`crate::rentable::verdict`]).
        ColRentable => ("Сдаётся?", "Rentable?"),
        RentYes => ("сдаётся", "rentable"),
        RentOfflineSince => ("не сдаётся: офлайн с {at}", "not rentable: offline since {at}"),
        RentOfflineNever => ("не сдаётся: офлайн, ещё не выходил на связь", "not rentable: offline, not seen yet"),
        RentNoGpu => ("не сдаётся: нет видеокарты или драйвера NVIDIA", "not rentable: no GPU or no NVIDIA driver"),
        NvmlLibraryMissing => (
            "библиотека драйвера NVIDIA (libnvidia-ml) не найдена",
            "the NVIDIA driver's library (libnvidia-ml) is not found",
        ),
        NvmlNoDevices => ("драйвер не видит ни одной видеокарты", "the driver sees no GPU"),
        NvmlError => ("драйвер NVIDIA ответил ошибкой", "the NVIDIA driver answered with an error"),
        NoGpuListed => ("в оборудовании нет ни одной видеокарты", "the hardware lists no GPU"),
        RentCheckFailed => ("не сдаётся: проверка видеокарты не пройдена", "not rentable: the GPU check failed"),
        RentQuarantined => (
            "не сдаётся: на карантине с {at}: проверка видеокарт после аренды не пройдена \
             ({why}); когда видеокарты свободны, запросите повторную проверку",
            "not rentable: quarantined since {at}: the GPU check after a rental failed \
             ({why}); once the GPUs are free, ask for a recheck",
        ),
        RentFix => ("Как исправить — выполните на машине:", "To fix it, run on the machine:"),
        RentAwaitingOperator => (
            "пока не сдаётся: ждём, когда оператор платформы выберет образ для проверки; от вас \
             ничего не требуется",
            "not rentable yet: waiting for the platform's operator to choose a check image; \
             nothing to do on your side",
        ),
        RentAwaitingCheck => ("пока не сдаётся: ожидает проверки видеокарты", "not rentable yet: awaiting the GPU check"),
        RentNoPrice => ("пока не сдаётся: цена не назначена", "not for rent yet: no price set"),
        RentPaused => ("не сдаётся: приостановлен вами", "not rentable: paused by you"),
        RentMaintenance => (
            "не сдаётся: обслуживание с {from} до {until}",
            "not rentable: maintenance from {from} to {until}",
        ),
        RentOwnerDisabled => (
            "не сдаётся: учётная запись владельца отключена оператором платформы с {at}",
            "not rentable: the owner's account was disabled by the platform's operator at {at}",
        ),
        // The figures, the day's chart and the event log of a server.
        FiguresTitle => ("Показатели", "Figures"),
        FiguresAsOf => ("по последней связи, {at}", "as of the last heartbeat, {at}"),
        NoFigures => ("Агент ещё не присылал показатели.", "The agent has sent no figures yet."),
        NoGpuFigures => (
            "Показателей видеокарт нет: драйвер NVIDIA их не сообщает.",
            "No GPU figures: the NVIDIA driver reports none.",
        ),
        ColGpu => ("Видеокарта", "GPU"),
        ColUtil => ("Загрузка", "Utilisation"),
        ColGpuMem => ("Видеопамять", "Video memory"),
        ColTemp => ("Температура", "Temperature"),
        ColPower => ("Мощность", "Power"),
        HostCpuLoad => ("Загрузка процессора", "CPU load"),
        HostRamUsed => ("ОЗУ занято", "RAM used"),
        HostDiskFree => ("Свободно на диске для Docker", "Free disk for Docker"),
        Percent => ("{n} %", "{n}%"),
        Mib => ("{n} МиБ", "{n} MiB"),
        Gib => ("{n} ГиБ", "{n} GiB"),
        UsedOf => ("{used} из {total}", "{used} of {total}"),
        Celsius => ("{n} °C", "{n} °C"),
        Watts => ("{n} Вт", "{n} W"),
        HistoryTitle => ("За последние сутки", "The last day"),
        HistoryHelp => (
            "Отсчёт раз в 5 минут, шкала от 0 до 100 %; разрыв линии — сервер был офлайн.",
            "A sample every 5 minutes, on a scale of 0 to 100%; a break in a line: the server was offline.",
        ),
        NoHistory => (
            "Истории пока нет: первый отсчёт придёт с первой связью агента.",
            "No history yet: the first sample comes with the agent's first heartbeat.",
        ),
        SeriesGpuUtil => ("загрузка видеокарт (в среднем)", "GPU utilisation (average)"),
        SeriesGpuMem => ("видеопамять занята", "video memory used"),
        SeriesCpu => ("загрузка процессора", "CPU load"),
        SeriesRam => ("ОЗУ занято", "RAM used"),
        ChartTitle => (
            "График показателей сервера за сутки; отсчётов: {n}",
            "The server's figures over the last day; samples: {n}",
        ),
        EventsTitle => ("Журнал событий", "Event log"),
        NoEvents => ("Событий пока нет.", "No events yet."),
        ColTime => ("Время", "Time"),
        ColEvent => ("Событие", "Event"),
        EvRegistered => ("сервер зарегистрирован", "the server registered"),
        EvOnline => ("вышел на связь", "came online"),
        EvOffline => (
            "офлайн: после этого агент не выходил на связь",
            "went offline: no heartbeat after this",
        ),
        EvHardwareChanged => ("изменилось оборудование: {parts}", "the hardware changed: {parts}"),
        PartGpus => ("видеокарты", "GPUs"),
        PartCpu => ("процессор", "CPU"),
        PartRam => ("ОЗУ", "RAM"),
        PartDisk => ("диск", "disk"),
        PartSoftware => ("программы", "software"),
        PartHostname => ("имя компьютера", "host name"),
        EvCheckPassed => ("проверка видеокарты пройдена", "the GPU check passed"),
        EvCheckFailed => ("проверка видеокарты не пройдена", "the GPU check failed"),
        EvCommandSent => ("отправлена команда: {cmd}", "command sent: {cmd}"),
        EvCommandOk => ("команда выполнена: {cmd}", "command done: {cmd}"),
        EvCommandFailed => ("команда не выполнена: {cmd}", "command failed: {cmd}"),
        CmdRecheck => ("повторная проверка", "check again"),
        CmdRestart => ("перезапуск агента", "restart the agent"),
        EvContainerRemoved => ("агент удалил контейнер {name}", "the agent removed container {name}"),
        RemovalUnknown => ("платформа его не знает", "unknown to the platform"),
        EvTokenReplaced => ("токен сервера заменён", "the server's token was replaced"),
        EvDeleted => ("сервер удалён", "the server was deleted"),
        EvRentalCreated => ("создана аренда {id}", "rental {id} created"),
        EvRentalStarted => ("аренда {id} запущена", "rental {id} started"),
        EvRentalExited => ("процесс аренды {id} завершился, код {code}", "rental {id} exited with code {code}"),
        EvRentalStopped => ("аренда {id} остановлена", "rental {id} stopped"),
        EvRentalGone => (
            "аренда {id} удалена с сервера, и это проверено",
            "rental {id} torn down and verified gone",
        ),
        EvRentalFailed => ("сбой аренды {id}", "rental {id} failed"),
        EvQuarantined => ("сервер на карантине", "server quarantined"),
        EvQuarantineLifted => (
            "карантин снят: видеокарты свободны и отвечают",
            "quarantine lifted: the GPUs are free and answering",
        ),
        // The server's rentals (issue 33).
        RentalsTitle => ("Аренды", "Rentals"),
        NoRentals => ("Аренд на этом сервере нет.", "No rentals on this server."),
        ColRental => ("Аренда", "Rental"),
        ColImage => ("Образ", "Image"),
        ColRentalGpus => ("Видеокарты", "GPUs"),
        ColRentalState => ("Состояние", "State"),
        ColUntil => ("Конец", "End"),
        RentalPending => ("ждёт агента", "waiting for the agent"),
        RentalPulling => ("загружается образ", "pulling the image"),
        RentalStarting => ("запускается", "starting"),
        RentalRunning => ("работает", "running"),
        RentalExitedState => ("процесс завершился", "exited"),
        RentalStopping => ("останавливается", "stopping"),
        RentalGoneState => ("удалена", "gone"),
        RentalFailedState => ("сбой", "failed"),
        RentalStoppedState => ("остановлена", "stopped"),
        RentalExpired => ("срок истёк", "expired"),
        // Why a probe failed ([`probe_failure`]), with what to do where there is something to do.
        ProbeNoNvidiaRuntime => (
            "в Docker не настроена среда выполнения NVIDIA: выполните sudo nvidia-ctk runtime \
             configure --runtime=docker и sudo systemctl restart docker",
            "Docker has no nvidia runtime: run sudo nvidia-ctk runtime configure --runtime=docker \
             and sudo systemctl restart docker",
        ),
        ProbeDeviceRequestRefused => ("Docker отказал контейнеру в доступе к видеокарте", "Docker refused the container access to the GPU"),
        ProbeNvidiaSmiFailed => ("программа nvidia-smi в контейнере завершилась с ошибкой", "nvidia-smi failed inside the container"),
        ProbeNvmlUnknownError => (
            "Видеокарта не видна внутри контейнера: проверьте nvidia-smi на машине, затем выполните \
             sudo nvidia-ctk runtime configure --runtime=docker и sudo systemctl restart docker",
            "The GPU is not visible inside the container: check nvidia-smi on the machine, then run \
             sudo nvidia-ctk runtime configure --runtime=docker and sudo systemctl restart docker",
        ),
        ProbeDriverLibraryMismatch => (
            "версии драйвера NVIDIA и его библиотеки не совпадают: перезагрузите машину",
            "the NVIDIA driver and its library differ in version: reboot the machine",
        ),
        ProbeImagePullFailed => ("не удалось скачать образ для проверки", "the probe image could not be downloaded"),
        ProbeTimeout => ("проверка не уложилась в отведённое время", "the check did not finish in time"),
        ProbeDockerUnavailable => ("Docker не отвечает", "Docker does not answer"),
        ProbeImageNotPinned => (
            "образ для проверки указан без контрольной суммы (@sha256:…); ничего не скачано",
            "the probe image is not pinned by digest; nothing was downloaded",
        ),
        ProbeRegistryNotAccepted => (
            "хранилище образа для проверки не разрешено на этой машине; ничего не скачано",
            "the probe image's registry is not accepted on this machine; nothing was downloaded",
        ),
        // Units, as the owner's guide writes them.
        // A live page says when it was last updated, and when the connection or the session is
        // lost (`dashboard.js` reads these from the page's `data-` attributes).
        LiveUpdated => ("Обновлено в {time}.", "Updated at {time}."),
        LiveLost => (
            "Связь с платформой потеряна — данные ниже могут быть устаревшими.",
            "Connection lost — the figures below may be out of date.",
        ),
        LiveSignedOut => ("Вы вышли из кабинета — войдите снова.", "You were signed out — sign in again."),
        SignInAgain => ("Войти снова", "Sign in again"),
        // Commands and what became of them.
        ColWhen => ("Когда", "When"),
        ColCommand => ("Команда", "Command"),
        ColResult => ("Результат", "Result"),
        CommandUndelivered => ("не доставлена: сервер офлайн", "not delivered: the server is offline"),
        CommandLost => ("агент не ответил: сервер офлайн", "the agent did not answer: the server is offline"),
        Restarting => ("агент перезапускается…", "restarting…"),
        BackOnline => ("агент перезапущен и снова онлайн", "back online"),
        NotBack => (
            "агент не вернулся после перезапуска: сервер офлайн",
            "the agent has not come back after the restart: the server is offline",
        ),
        RecheckDelivered => (
            "передана агенту; проверка начнётся, как только позволит ограничение частоты",
            "handed to the agent; the check starts as soon as the rate limit allows",
        ),
        RecheckRunning => ("проверка идёт, ждём её результата", "the check is running; waiting for its result"),
        RecheckPassed => ("проверка пройдена", "check passed"),
        RecheckFailed => ("проверка не пройдена", "check failed"),
        RecheckNoImage => (
            "проверка не запускалась: оператор платформы ещё не выбрал образ для проверки",
            "no check ran: the platform's operator has not chosen a check image yet",
        ),
        RecheckNoResult => ("результата проверки нет: сервер офлайн", "no check result: the server is offline"),
        // Join codes: open ones, and a code shown once.
        OpenCodes => ("Открытые коды подключения", "Open join codes"),
        NoOpenCodes => ("Открытых кодов нет.", "No open codes."),
        ColCreated => ("Создан", "Created"),
        ColExpires => ("Действует до", "Valid until"),
        ColStatus => ("Состояние", "Status"),
        CodeWaiting => ("ждёт машину", "waiting for a machine"),
        OpenCodePage => ("Открыть", "Open"),
        CodeShownOnce => (
            "Код показан один раз и на платформе не хранится (только его хеш). Если вы его потеряли, \
             создайте новый код.",
            "The code was shown once and is not stored on the platform (only its hash). If you lost \
             it, create a new code.",
        ),
        CodeUsedNoCommand => (
            "Код использован: команда установки больше не нужна.",
            "The code was used: the install command is no longer needed.",
        ),
        NewCode => ("Создать новый код", "Create a new code"),
    }
}

/// The text of `m` in `lang`.
pub fn t(m: Msg, lang: Lang) -> &'static str {
    m.text(lang)
}

/// The verification state's label, as the seed names it.
pub fn verification(v: VerificationState, lang: Lang) -> &'static str {
    t(
        match v {
            VerificationState::Verified => Msg::Verified,
            VerificationState::AwaitingCheck => Msg::AwaitingCheck,
            VerificationState::Failed => Msg::CheckFailed,
        },
        lang,
    )
}

/// Why a probe failed, with what to do where there is something to do.
pub fn probe_failure(f: ProbeFailure, lang: Lang) -> &'static str {
    use ProbeFailure::*;
    t(
        match f {
            NoNvidiaRuntime => Msg::ProbeNoNvidiaRuntime,
            DeviceRequestRefused => Msg::ProbeDeviceRequestRefused,
            NvidiaSmiFailed => Msg::ProbeNvidiaSmiFailed,
            NvmlUnknownError => Msg::ProbeNvmlUnknownError,
            DriverLibraryMismatch => Msg::ProbeDriverLibraryMismatch,
            ImagePullFailed => Msg::ProbeImagePullFailed,
            Timeout => Msg::ProbeTimeout,
            DockerUnavailable => Msg::ProbeDockerUnavailable,
            ImageNotPinned => Msg::ProbeImageNotPinned,
            RegistryNotAccepted => Msg::ProbeRegistryNotAccepted,
        },
        lang,
    )
}

/// The command that fixes a failed probe, run on the machine, where there is one.
pub fn probe_fix(f: ProbeFailure) -> Option<&'static str> {
    use ProbeFailure::*;
    match f {
        NoNvidiaRuntime | NvmlUnknownError => {
            Some("sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker")
        }
        DriverLibraryMismatch => Some("sudo reboot"),
        DockerUnavailable => Some("sudo systemctl restart docker"),
        DeviceRequestRefused | NvidiaSmiFailed | ImagePullFailed | Timeout | ImageNotPinned
        | RegistryNotAccepted => None,
    }
}

/// Why NVML does not work, as the "no GPU or no driver" verdict explains it; `None` when it
/// works (then the inventory lists no GPU).
pub fn nvml_problem(s: NvmlState, lang: Lang) -> Option<&'static str> {
    let m = match s {
        NvmlState::Ok => return None,
        NvmlState::LibraryMissing => Msg::NvmlLibraryMissing,
        NvmlState::DriverLibraryMismatch => Msg::ProbeDriverLibraryMismatch,
        NvmlState::NoDevices => Msg::NvmlNoDevices,
        NvmlState::Error => Msg::NvmlError,
    };
    Some(t(m, lang))
}

/// The language of a request: the switch's cookie, else the first of `ru`/`en` by
/// `Accept-Language` preference (q-values honoured), else English.
pub fn negotiate(cookie: Option<&str>, accept_language: Option<&str>) -> Lang {
    if let Some(l) = cookie.and_then(Lang::parse) {
        return l;
    }
    let mut best: Option<(f32, Lang)> = None;
    for part in accept_language.unwrap_or("").split(',') {
        let mut it = part.split(';');
        let tag = it.next().unwrap_or("").trim().to_ascii_lowercase();
        let q =
            it.find_map(|p| p.trim().strip_prefix("q=").and_then(|q| q.parse::<f32>().ok())).unwrap_or(1.0);
        let primary = tag.split('-').next().unwrap_or("");
        let lang = match primary {
            "ru" => Lang::Ru,
            "en" => Lang::En,
            _ => continue,
        };
        if q > 0.0 && best.is_none_or(|(bq, _)| q > bq) {
            best = Some((q, lang));
        }
    }
    best.map(|(_, l)| l).unwrap_or(Lang::En)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_language_picks_by_preference() {
        assert_eq!(negotiate(None, Some("ru-RU,ru;q=0.9,en;q=0.8")), Lang::Ru);
        assert_eq!(negotiate(None, Some("en-US,en;q=0.9,ru;q=0.8")), Lang::En);
        assert_eq!(negotiate(None, Some("de-DE,ru;q=0.5,en;q=0.7")), Lang::En);
        assert_eq!(negotiate(None, Some("de,ru;q=0.3")), Lang::Ru);
        assert_eq!(negotiate(None, Some("fr")), Lang::En);
        assert_eq!(negotiate(None, None), Lang::En);
        assert_eq!(negotiate(Some("ru"), Some("en")), Lang::Ru);
        assert_eq!(negotiate(Some("xx"), Some("ru")), Lang::Ru);
    }

    #[test]
    fn every_text_exists_in_both_languages_and_placeholders_match() {
        use Msg::*;
        for m in Msg::ALL {
            let (ru, en) = (m.text(Lang::Ru), m.text(Lang::En));
            // The switch names the other language in that language's own words.
            let (ru, en) = if *m == LangSwitch { (en, ru) } else { (ru, en) };
            if let Err(e) = gpum_common::texts::check(ru, en) {
                panic!("{m:?}: {e}");
            }
        }
        // The seed's words.
        assert_eq!(t(Verified, Lang::Ru), "Оборудование проверено");
        assert_eq!(t(AwaitingCheck, Lang::Ru), "Ожидает проверки");
        assert_eq!(t(Delete, Lang::Ru), "Удалить");
    }
}
